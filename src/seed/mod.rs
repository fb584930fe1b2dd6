//! The seed RL dataset: one instance per kept PR, in the SWE-RL format — the issue, the code
//! files (changed and relevant, shuffled so the changed ones are not always first), SEARCH/
//! REPLACE instructions, and the oracle the reward compares against.
//!
//! Written as the Delta table `rl_seed` and as Parquet shards `LAKE/shards/seed/part-NNNNN.
//! parquet` with verl-style columns (`data_source`, `prompt`, `ability`, `reward_model`,
//! `extra_info`) that trainers read directly. Every instance is checked on the way: the
//! oracle, written as SEARCH/REPLACE edits, must score reward 1.0. Instances that cannot be
//! built (prompt over the token budget even without relevant files, no text left...) go to
//! `seed_rejections` with a reason.

pub mod oracle;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use arrow::array::{
    Array, ArrayRef, AsArray, Float64Builder, Int64Builder, ListBuilder, MapBuilder, RecordBatch, StringBuilder,
    StructBuilder,
};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use serde::Serialize;

use crate::config::SeedConfig;
use crate::lake::Lake;

pub const RL_SEED: &str = "rl_seed";
pub const SEED_REJECTIONS: &str = "seed_rejections";
pub const DATA_SOURCE: &str = "swelake/swe-rl-seed";

/// One instance before it becomes a row.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub instance_id: String,
    pub repo_name: String,
    pub pr_number: i64,
    pub problem_statement: String,
    pub context: BTreeMap<String, String>,
    pub oracle: BTreeMap<String, String>,
    pub oracle_patch: String,
    pub system: String,
    pub user: String,
    pub split: String,
    pub changed_files: Vec<String>,
    pub relevant_files: Vec<String>,
    pub issue_numbers: Vec<i64>,
    pub prompt_tokens: usize,
    pub oracle_reward: f64,
    pub base_sha: String,
    pub merge_base: String,
    pub head_sha: String,
    pub merged_at: String,
    pub language: String,
}

/// The prompt templates (built in, or replaced by the config's files).
pub struct Templates {
    pub system: String,
    pub user: String,
    pub file: String,
}

impl Templates {
    pub fn load(cfg: &SeedConfig) -> Result<Templates> {
        let read = |path: &str, default: &str| -> Result<String> {
            if path.is_empty() {
                Ok(default.to_string())
            } else {
                std::fs::read_to_string(path).with_context(|| format!("reading template {path}"))
            }
        };
        Ok(Templates {
            system: read(&cfg.system_template, include_str!("../../templates/system.txt"))?,
            user: read(&cfg.user_template, include_str!("../../templates/user.txt"))?,
            file: include_str!("../../templates/file.txt").to_string(),
        })
    }

    fn render_files(&self, files: &[(&String, &String)]) -> String {
        files
            .iter()
            .map(|(p, c)| self.file.replace("{path}", p).replace("{content}", c.trim_end_matches('\n')))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn render_user(&self, repo: &str, problem: &str, files: &str) -> String {
        self.user.replace("{repo}", repo).replace("{problem_statement}", problem.trim()).replace("{files}", files)
    }
}

/// FNV-1a: stable across runs and platforms, for the split and the file order.
fn fnv(s: &str, seed: u64) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64 ^ seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// `train`, `test`, or `excluded`: a repository is all train or all test (by a hash of its
/// name); with `test_after`, train keeps what was merged before it and test what was merged
/// on or after it, and the rest is excluded, so neither repositories nor time leak.
pub fn split_of(repo: &str, merged_at: &str, cfg: &SeedConfig) -> &'static str {
    let test_repo = (fnv(repo, 0x5e1f) % 10_000) < (cfg.test_fraction * 10_000.0) as u64;
    if cfg.test_after.is_empty() {
        return if test_repo { "test" } else { "train" };
    }
    let after = merged_at >= cfg.test_after.as_str();
    match (test_repo, after) {
        (true, true) => "test",
        (false, false) => "train",
        _ => "excluded",
    }
}

/// Deterministic shuffle (Fisher-Yates with an LCG seeded by the instance).
fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut s = seed | 1;
    for i in (1..v.len()).rev() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let j = (s >> 33) as usize % (i + 1);
        v.swap(i, j);
    }
}

/// A PR's raw material, read from the lake.
#[derive(Debug, Default, Clone)]
struct Material {
    repo: String,
    number: i64,
    title: String,
    body: String,
    merged_at: String,
    base_sha: String,
    head_sha: String,
    merge_base: String,
    issues: Vec<(i64, String, String)>,
    files: Vec<FileRow>,
    relevant: Vec<(String, String)>,
}

/// (path, old path, status, old blob, new blob, patch, is_binary, language)
type FileRow = (String, Option<String>, String, Option<String>, Option<String>, String, bool, Option<String>);

/// What a seed run built.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SeedSummary {
    pub instances: usize,
    pub train: usize,
    pub test: usize,
    pub excluded: usize,
    pub rejected: BTreeMap<String, usize>,
    pub relevant_files_dropped_for_budget: usize,
    pub shards: Vec<String>,
    pub mean_prompt_tokens: f64,
}

fn col_str(b: &RecordBatch, i: usize) -> Result<arrow::array::StringArray> {
    Ok(arrow::compute::cast(b.column(i), &DataType::Utf8)?.as_string::<i32>().clone())
}

fn opt(a: &arrow::array::StringArray, r: usize) -> Option<String> {
    (!a.is_null(r)).then(|| a.value(r).to_string())
}

async fn load_material(lake: &Lake) -> Result<BTreeMap<(String, i64), Material>> {
    let ctx = lake.session().await?;
    let mut m: BTreeMap<(String, i64), Material> = BTreeMap::new();
    let q =
        "SELECT q.repo_name, q.pr_number, coalesce(p.title, ''), coalesce(p.body, ''), CAST(p.merged_at AS VARCHAR), \
             s.base_sha, s.head_sha, s.merge_base \
             FROM pr_quality q JOIN pull_requests p ON p.repo_name = q.repo_name AND p.number = q.pr_number \
             JOIN pr_snapshots s ON s.repo_name = q.repo_name AND s.pr_number = q.pr_number AND s.status = 'ok' \
             WHERE q.keep";
    for b in ctx.sql(q).await?.collect().await? {
        let c: Vec<_> = (0..8).map(|i| col_str(&b, i)).collect::<Result<_>>()?;
        for r in 0..b.num_rows() {
            let number: i64 = c[1].value(r).parse().unwrap_or_default();
            m.insert(
                (c[0].value(r).to_string(), number),
                Material {
                    repo: c[0].value(r).to_string(),
                    number,
                    title: c[2].value(r).to_string(),
                    body: c[3].value(r).to_string(),
                    merged_at: opt(&c[4], r).unwrap_or_default(),
                    base_sha: c[5].value(r).to_string(),
                    head_sha: c[6].value(r).to_string(),
                    merge_base: opt(&c[7], r).unwrap_or_default(),
                    ..Default::default()
                },
            );
        }
    }
    let q = "SELECT l.repo_name, l.pr_number, l.issue_number, coalesce(i.title, ''), coalesce(i.body, '') \
             FROM pr_issue_links l JOIN issues i ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number \
             ORDER BY l.issue_number";
    if lake.has_table("pr_issue_links") && lake.has_table("issues") {
        for b in ctx.sql(q).await?.collect().await? {
            let c: Vec<_> = (0..5).map(|i| col_str(&b, i)).collect::<Result<_>>()?;
            for r in 0..b.num_rows() {
                let key = (c[0].value(r).to_string(), c[1].value(r).parse().unwrap_or_default());
                if let Some(x) = m.get_mut(&key) {
                    x.issues.push((
                        c[2].value(r).parse().unwrap_or_default(),
                        c[3].value(r).to_string(),
                        c[4].value(r).to_string(),
                    ));
                }
            }
        }
    }
    let q = "SELECT repo_name, pr_number, path, old_path, status, old_blob, new_blob, patch, CAST(is_binary AS VARCHAR), language \
             FROM pr_files ORDER BY repo_name, pr_number, path";
    for b in ctx.sql(q).await?.collect().await? {
        let c: Vec<_> = (0..10).map(|i| col_str(&b, i)).collect::<Result<_>>()?;
        for r in 0..b.num_rows() {
            let key = (c[0].value(r).to_string(), c[1].value(r).parse().unwrap_or_default());
            if let Some(x) = m.get_mut(&key) {
                x.files.push((
                    c[2].value(r).to_string(),
                    opt(&c[3], r),
                    c[4].value(r).to_string(),
                    opt(&c[5], r),
                    opt(&c[6], r),
                    c[7].value(r).to_string(),
                    c[8].value(r) == "true",
                    opt(&c[9], r),
                ));
            }
        }
    }
    if lake.has_table(crate::relevance::PR_RELEVANT_FILES) {
        let q =
            "SELECT repo_name, pr_number, path, blob_sha FROM pr_relevant_files ORDER BY repo_name, pr_number, rank";
        for b in ctx.sql(q).await?.collect().await? {
            let c: Vec<_> = (0..4).map(|i| col_str(&b, i)).collect::<Result<_>>()?;
            for r in 0..b.num_rows() {
                let key = (c[0].value(r).to_string(), c[1].value(r).parse().unwrap_or_default());
                if let Some(x) = m.get_mut(&key) {
                    x.relevant.push((c[2].value(r).to_string(), c[3].value(r).to_string()));
                }
            }
        }
    }
    Ok(m)
}

/// Contents of the needed blobs (UTF-8 text only).
async fn load_blobs(lake: &Lake, wanted: &[String]) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    if wanted.is_empty() || !lake.has_table(crate::snapshots::FILE_BLOBS) {
        return Ok(out);
    }
    let ctx = lake.session().await?;
    let list = wanted.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ");
    let q = format!("SELECT blob_sha, content FROM file_blobs WHERE content IS NOT NULL AND blob_sha IN ({list})");
    for b in ctx.sql(&q).await?.collect().await? {
        let (s, c) = (col_str(&b, 0)?, col_str(&b, 1)?);
        for r in 0..b.num_rows() {
            out.insert(s.value(r).to_string(), c.value(r).to_string());
        }
    }
    Ok(out)
}

/// A token counter: a tokenizer.json (the config's, else the cached MiniLM one).
pub fn token_counter(cfg: &SeedConfig) -> Result<tokenizers::Tokenizer> {
    let path: PathBuf = if cfg.tokenizer.is_empty() {
        crate::models::fetch(&crate::models::MINILM_TOKENIZER)?
    } else {
        PathBuf::from(&cfg.tokenizer)
    };
    let mut t = tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow!("loading {}: {e}", path.display()))?;
    t.with_truncation(None).map_err(|e| anyhow!("{e}"))?;
    t.with_padding(None);
    Ok(t)
}

fn count(t: &tokenizers::Tokenizer, text: &str) -> Result<usize> {
    Ok(t.encode(text, false).map_err(|e| anyhow!("counting tokens: {e}"))?.get_ids().len())
}

/// Builds the instances (pure: the lake is only read).
pub async fn build(
    lake: &Lake,
    cfg: &SeedConfig,
) -> Result<(Vec<Instance>, Vec<(String, i64, String, String)>, usize)> {
    let templates = Templates::load(cfg)?;
    let tokenizer = token_counter(cfg)?;
    let material = load_material(lake).await?;
    let mut wanted: Vec<String> = Vec::new();
    for x in material.values() {
        for f in &x.files {
            wanted.extend(f.3.iter().cloned());
            wanted.extend(f.4.iter().cloned());
        }
        wanted.extend(x.relevant.iter().map(|r| r.1.clone()));
    }
    wanted.sort();
    wanted.dedup();
    let blobs = load_blobs(lake, &wanted).await?;
    let mut instances = Vec::new();
    let mut rejected = Vec::new();
    let mut dropped_for_budget = 0;
    for x in material.values() {
        let reject = |reason: &str, detail: String| (x.repo.clone(), x.number, reason.to_string(), detail);
        let problem = if x.issues.is_empty() {
            format!("{}\n\n{}", x.title, x.body)
        } else {
            x.issues.iter().map(|(_, t, b)| format!("{t}\n\n{b}")).collect::<Vec<_>>().join("\n\n---\n\n")
        };
        let mut context = BTreeMap::new();
        let mut oracle = BTreeMap::new();
        let mut patches = Vec::new();
        let mut changed = Vec::new();
        let mut missing = None;
        for (path, old_path, status, old_blob, new_blob, patch, binary, _) in &x.files {
            if *binary {
                continue;
            }
            let old_at = old_path.clone().unwrap_or_else(|| path.clone());
            if let Some(b) = old_blob {
                match blobs.get(b) {
                    Some(c) => {
                        context.insert(old_at.clone(), c.clone());
                    }
                    None => missing = Some(format!("content of {old_at} ({b}) is not in file_blobs")),
                }
            }
            match (status.as_str(), new_blob) {
                ("D", _) => {
                    oracle.insert(path.clone(), String::new());
                }
                (_, Some(b)) => match blobs.get(b) {
                    Some(c) => {
                        oracle.insert(path.clone(), c.clone());
                    }
                    None => missing = Some(format!("content of {path} ({b}) is not in file_blobs")),
                },
                _ => {}
            }
            if status == "R" && old_at != *path {
                // A rename is the old file emptied and the new one created.
                oracle.insert(old_at.clone(), String::new());
            }
            patches.push(patch.clone());
            changed.push(path.clone());
        }
        if let Some(why) = missing {
            rejected.push(reject("content_missing", why));
            continue;
        }
        if oracle.is_empty() {
            rejected.push(reject("no_text_change", "every changed file is binary".into()));
            continue;
        }
        let mut relevant: Vec<(String, String)> = x
            .relevant
            .iter()
            .filter(|(p, _)| !context.contains_key(p) && !oracle.contains_key(p))
            .filter_map(|(p, b)| blobs.get(b).map(|c| (p.clone(), c.clone())))
            .collect();
        // Fit the budget by dropping relevant files, least relevant first.
        let seed = fnv(&format!("{}#{}", x.repo, x.number), cfg.shuffle_seed);
        let (user, tokens) = loop {
            let mut shown: Vec<(&String, &String)> = context.iter().collect();
            shown.extend(relevant.iter().map(|(p, c)| (p, c)));
            shuffle(&mut shown, seed);
            let user = templates.render_user(&x.repo, &problem, &templates.render_files(&shown));
            let tokens = count(&tokenizer, &templates.system)? + count(&tokenizer, &user)?;
            if tokens <= cfg.max_prompt_tokens || relevant.is_empty() {
                break (user, tokens);
            }
            relevant.pop();
            dropped_for_budget += 1;
        };
        if tokens > cfg.max_prompt_tokens {
            rejected.push(reject(
                "prompt_too_long",
                format!("{tokens} tokens > {} even without relevant files", cfg.max_prompt_tokens),
            ));
            continue;
        }
        // The instance's context: every file shown, so edits of a distractor are scored as
        // wrong (similarity 0) rather than malformed.
        let mut full_context = context.clone();
        for (p, c) in &relevant {
            full_context.insert(p.clone(), c.clone());
        }
        let answer = oracle::oracle_answer(&full_context, &oracle);
        let oracle_reward =
            crate::reward::search_replace_reward(&full_context, &oracle, &answer).map(|r| r.reward).unwrap_or(-1.0);
        let language = x.files.iter().filter_map(|f| f.7.clone()).next().unwrap_or_default();
        instances.push(Instance {
            instance_id: format!("{}#{}", x.repo, x.number),
            repo_name: x.repo.clone(),
            pr_number: x.number,
            problem_statement: problem,
            context: full_context,
            oracle,
            oracle_patch: patches.join(""),
            system: templates.system.clone(),
            user,
            split: split_of(&x.repo, &x.merged_at, cfg).to_string(),
            changed_files: changed,
            relevant_files: relevant.iter().map(|(p, _)| p.clone()).collect(),
            issue_numbers: x.issues.iter().map(|i| i.0).collect(),
            prompt_tokens: tokens,
            oracle_reward,
            base_sha: x.base_sha.clone(),
            merge_base: x.merge_base.clone(),
            head_sha: x.head_sha.clone(),
            merged_at: x.merged_at.clone(),
            language,
        });
    }
    instances.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    Ok((instances, rejected, dropped_for_budget))
}

fn map_field(name: &str) -> Field {
    let entries =
        Fields::from(vec![Field::new("keys", DataType::Utf8, false), Field::new("values", DataType::Utf8, true)]);
    Field::new(name, DataType::Map(Arc::new(Field::new("entries", DataType::Struct(entries), false)), false), false)
}

fn message_fields() -> Fields {
    Fields::from(vec![Field::new("role", DataType::Utf8, false), Field::new("content", DataType::Utf8, false)])
}

fn extra_fields() -> Fields {
    let list = |n: &str, t: DataType| Field::new(n, DataType::List(Arc::new(Field::new("item", t, true))), false);
    Fields::from(vec![
        Field::new("repo_name", DataType::Utf8, false),
        Field::new("pr_number", DataType::Int64, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("base_sha", DataType::Utf8, false),
        Field::new("merge_base", DataType::Utf8, false),
        Field::new("head_sha", DataType::Utf8, false),
        Field::new("merged_at", DataType::Utf8, false),
        Field::new("language", DataType::Utf8, false),
        list("changed_files", DataType::Utf8),
        list("relevant_files", DataType::Utf8),
        list("issue_numbers", DataType::Int64),
        Field::new("prompt_tokens", DataType::Int64, false),
        Field::new("oracle_reward", DataType::Float64, false),
    ])
}

/// The columns of `rl_seed` and of the shards.
pub fn seed_schema() -> SchemaRef {
    let msg = Field::new("item", DataType::Struct(message_fields()), true);
    let rm = Fields::from(vec![
        Field::new("style", DataType::Utf8, false),
        Field::new("ground_truth", DataType::Utf8, false),
    ]);
    Arc::new(Schema::new(vec![
        Field::new("instance_id", DataType::Utf8, false),
        Field::new("repo_name", DataType::Utf8, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("problem_statement", DataType::Utf8, false),
        map_field("context"),
        map_field("oracle"),
        Field::new("oracle_patch", DataType::Utf8, false),
        Field::new("data_source", DataType::Utf8, false),
        Field::new("prompt", DataType::List(Arc::new(msg)), false),
        Field::new("ability", DataType::Utf8, false),
        Field::new("reward_model", DataType::Struct(rm), false),
        Field::new("extra_info", DataType::Struct(extra_fields()), false),
    ]))
}

/// The instances as one record batch of [`seed_schema`].
pub fn to_batch(instances: &[Instance]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&Instance) -> String| -> ArrayRef {
        Arc::new(arrow::array::StringArray::from_iter_values(instances.iter().map(f)))
    };
    let map = |f: &dyn Fn(&Instance) -> &BTreeMap<String, String>| -> Result<ArrayRef> {
        let mut b = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        for i in instances {
            for (k, v) in f(i) {
                b.keys().append_value(k);
                b.values().append_value(v);
            }
            b.append(true)?;
        }
        Ok(Arc::new(b.finish()))
    };
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(message_fields(), instances.len()))
        .with_field(Arc::new(Field::new("item", DataType::Struct(message_fields()), true)));
    for i in instances {
        for (role, content) in [("system", &i.system), ("user", &i.user)] {
            let m = prompt.values();
            m.field_builder::<StringBuilder>(0).expect("role").append_value(role);
            m.field_builder::<StringBuilder>(1).expect("content").append_value(content);
            m.append(true);
        }
        prompt.append(true);
    }
    let rm_fields = Fields::from(vec![
        Field::new("style", DataType::Utf8, false),
        Field::new("ground_truth", DataType::Utf8, false),
    ]);
    let mut rm = StructBuilder::from_fields(rm_fields, instances.len());
    for i in instances {
        rm.field_builder::<StringBuilder>(0).expect("style").append_value("rule");
        let gt = serde_json::json!({"kind": "search_replace", "context": i.context, "oracle": i.oracle});
        rm.field_builder::<StringBuilder>(1).expect("ground_truth").append_value(gt.to_string());
        rm.append(true);
    }
    let mut extra = StructBuilder::from_fields(extra_fields(), instances.len());
    for i in instances {
        let strs = [&i.repo_name, &i.split, &i.base_sha, &i.merge_base, &i.head_sha, &i.merged_at, &i.language];
        let idx = [0usize, 2, 3, 4, 5, 6, 7];
        for (k, v) in idx.iter().zip(strs) {
            extra.field_builder::<StringBuilder>(*k).expect("string field").append_value(v);
        }
        extra.field_builder::<Int64Builder>(1).expect("pr_number").append_value(i.pr_number);
        for (k, list) in [(8usize, &i.changed_files), (9, &i.relevant_files)] {
            let lb = extra.field_builder::<ListBuilder<Box<dyn arrow::array::ArrayBuilder>>>(k).expect("list field");
            for v in list {
                lb.values().as_any_mut().downcast_mut::<StringBuilder>().expect("string items").append_value(v);
            }
            lb.append(true);
        }
        let lb = extra.field_builder::<ListBuilder<Box<dyn arrow::array::ArrayBuilder>>>(10).expect("issue_numbers");
        for v in &i.issue_numbers {
            lb.values().as_any_mut().downcast_mut::<Int64Builder>().expect("int items").append_value(*v);
        }
        lb.append(true);
        extra.field_builder::<Int64Builder>(11).expect("prompt_tokens").append_value(i.prompt_tokens as i64);
        extra.field_builder::<Float64Builder>(12).expect("oracle_reward").append_value(i.oracle_reward);
        extra.append(true);
    }
    let cols: Vec<ArrayRef> = vec![
        s(&|i| i.instance_id.clone()),
        s(&|i| i.repo_name.clone()),
        s(&|i| i.split.clone()),
        s(&|i| i.problem_statement.clone()),
        map(&|i| &i.context)?,
        map(&|i| &i.oracle)?,
        s(&|i| i.oracle_patch.clone()),
        s(&|_| DATA_SOURCE.to_string()),
        Arc::new(prompt.finish()),
        s(&|_| "software_engineering".to_string()),
        Arc::new(rm.finish()),
        Arc::new(extra.finish()),
    ];
    Ok(RecordBatch::try_new(seed_schema(), cols)?)
}

/// Writes the shards of `batch` (deterministic order, `rows_per_shard` rows each) into
/// `dir`, replacing earlier shards.
pub fn write_shards(dir: &Path, batch: &RecordBatch, rows_per_shard: usize) -> Result<Vec<PathBuf>> {
    if dir.exists() {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("part-")) {
                std::fs::remove_file(&p)?;
            }
        }
    }
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3)?))
        .build();
    let per = rows_per_shard.max(1);
    let mut start = 0;
    while start < batch.num_rows() || (start == 0 && batch.num_rows() == 0) {
        let len = per.min(batch.num_rows() - start);
        let path = dir.join(format!("part-{:05}.parquet", out.len()));
        let mut w =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), Some(props.clone()))?;
        w.write(&batch.slice(start, len))?;
        w.close()?;
        out.push(path);
        start += len;
        if len == 0 {
            break;
        }
    }
    Ok(out)
}

/// Builds the seed dataset: `rl_seed`, the shards and `seed_rejections`.
pub async fn run(lake: &Lake, cfg: &SeedConfig) -> Result<SeedSummary> {
    for t in ["pr_quality", "pull_requests", "pr_snapshots", "pr_files"] {
        if !lake.has_table(t) {
            anyhow::bail!("no `{t}` table yet: run the filters and snapshots jobs first");
        }
    }
    let (instances, rejected, dropped) = build(lake, cfg).await?;
    let mut summary = SeedSummary { relevant_files_dropped_for_budget: dropped, ..Default::default() };
    for (_, _, reason, _) in &rejected {
        *summary.rejected.entry(reason.clone()).or_default() += 1;
    }
    let kept: Vec<Instance> = instances.iter().filter(|i| i.split != "excluded").cloned().collect();
    summary.excluded = instances.len() - kept.len();
    summary.instances = kept.len();
    summary.train = kept.iter().filter(|i| i.split == "train").count();
    summary.test = kept.iter().filter(|i| i.split == "test").count();
    summary.mean_prompt_tokens = if kept.is_empty() {
        0.0
    } else {
        kept.iter().map(|i| i.prompt_tokens as f64).sum::<f64>() / kept.len() as f64
    };
    let batch = to_batch(&kept)?;
    let table = lake.ensure_table(RL_SEED, &batch.schema(), &[]).await?;
    table
        .write(vec![batch.clone()])
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .context("writing rl_seed")?;
    let shards = write_shards(&lake.root().join("shards/seed"), &batch, cfg.rows_per_shard)?;
    summary.shards = shards.iter().map(|p| p.display().to_string()).collect();

    let rej = crate::lake::non_null_batch(vec![
        (
            "repo_name",
            Arc::new(arrow::array::StringArray::from_iter_values(rejected.iter().map(|r| r.0.as_str()))) as ArrayRef,
        ),
        ("pr_number", Arc::new(arrow::array::Int64Array::from_iter_values(rejected.iter().map(|r| r.1)))),
        ("reason", Arc::new(arrow::array::StringArray::from_iter_values(rejected.iter().map(|r| r.2.as_str())))),
        ("detail", Arc::new(arrow::array::StringArray::from_iter_values(rejected.iter().map(|r| r.3.as_str())))),
    ])?;
    let t = lake.ensure_table(SEED_REJECTIONS, &rej.schema(), &[]).await?;
    t.write(vec![rej])
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .context("writing seed_rejections")?;
    Ok(summary)
}
