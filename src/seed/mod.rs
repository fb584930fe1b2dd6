//! The seed RL dataset: one instance per kept PR, in the SWE-RL format — the issue, the code
//! files (changed and relevant, shuffled so the changed ones are not always first), SEARCH/
//! REPLACE instructions, and the oracle the reward compares against.
//!
//! Written as the Delta table `rl_seed` and as Parquet shards `LAKE/shards/seed/part-NNNNN.
//! parquet` with verl-style columns (`data_source`, `prompt`, `ability`, `reward_model`,
//! `extra_info`) that trainers read directly; the shards hold the table's maps as lists of
//! `{path, content}` ([`shard_batch`]), the form Hugging Face `datasets` reads. Every instance is checked on the way: the
//! oracle, written as SEARCH/REPLACE edits, must score reward 1.0. Instances that cannot be
//! built (prompt over the token budget even without relevant files, no text left...) go to
//! `seed_rejections` with a reason.

pub(crate) mod oracle;
pub mod segments;
mod shard_rows;

pub use shard_rows::{seed_schema, shard_batch, shard_schema, to_batch, write_shards, SHARDS_DIR};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use arrow::array::{ArrayRef, RecordBatch};
use serde::{Deserialize, Serialize};

use crate::lake::{rows, Lake};
use datafusion::prelude::SessionContext;

pub const RL_SEED: &str = "rl_seed";
pub const SEED_REJECTIONS: &str = "seed_rejections";
/// The shards' layout (not a table: `schemas/seed_shards.toml`).
pub const SEED_SHARDS: &str = "seed_shards";
/// The seed stage: its inputs as a whole, rebuilt when any of their files or the `[seed]`
/// section change; it writes the shards under `LAKE/shards/seed/` too.
pub struct Seed;

#[async_trait::async_trait(?Send)]
impl crate::stage::Stage for Seed {
    fn name(&self) -> &'static str {
        "seed"
    }

    fn description(&self) -> &'static str {
        "rl_seed and LAKE/shards/seed/*.parquet: the SWE-RL seed dataset (issue, code files, SEARCH/REPLACE \
         instructions, oracle), rebuilt when its inputs or the config change."
    }

    fn inputs(&self) -> &'static [&'static str] {
        &[
            "pr_quality",
            "pull_requests",
            "pr_snapshots",
            "pr_files",
            "file_blobs",
            "pr_relevant_files",
            "pr_issue_links",
            "issues",
            "pr_verification",
        ]
    }

    fn optional_inputs(&self) -> &'static [&'static str] {
        &["file_blobs", "pr_relevant_files", "pr_issue_links", "issues", "pr_verification"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[RL_SEED, SEED_REJECTIONS]
    }

    fn unit(&self) -> crate::stage::Unit {
        crate::stage::Unit::Whole
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["relevance", "verify"]
    }

    fn config_section(&self) -> Option<&'static str> {
        Some("seed")
    }

    async fn run(&self, lake: &Lake, ctx: &crate::stage::StageCtx<'_>) -> Result<crate::stage::JobSummary> {
        Ok(run(lake, &SeedOptions { config: ctx.config::<SeedConfig>() }).await?.into())
    }
}

impl From<SeedSummary> for crate::stage::JobSummary {
    fn from(s: SeedSummary) -> crate::stage::JobSummary {
        let mut notes = BTreeMap::from([
            ("instances".to_string(), s.instances as i64),
            ("train".to_string(), s.train as i64),
            ("test".to_string(), s.test as i64),
            ("excluded_by_split".to_string(), s.excluded as i64),
            ("shards".to_string(), s.shards.len() as i64),
            ("relevant_files_dropped_for_budget".to_string(), s.relevant_files_dropped_for_budget as i64),
            ("mean_prompt_tokens".to_string(), s.mean_prompt_tokens.round() as i64),
        ]);
        for (k, v) in &s.rejected {
            notes.insert(format!("rejected:{k}"), *v as i64);
        }
        crate::stage::JobSummary { rows_out: s.instances as u64, notes, files: s.shards, ..Default::default() }
    }
}
pub const DATA_SOURCE: &str = "swelake/swe-rl-seed";

const PRS_SQL: &str = include_str!("../../sql/seed_prs.sql");
const ISSUES_SQL: &str = include_str!("../../sql/seed_issues.sql");
const FILES_SQL: &str = include_str!("../../sql/seed_files.sql");
const RELEVANT_SQL: &str = include_str!("../../sql/seed_relevant.sql");

/// The `[seed]` section of the curation config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedConfig {
    pub max_prompt_tokens: usize,
    pub tokenizer: String,
    pub test_fraction: f64,
    pub test_after: String,
    pub rows_per_shard: usize,
    pub system_template: String,
    pub user_template: String,
    pub shuffle_seed: u64,
}

impl Default for SeedConfig {
    fn default() -> Self {
        crate::config::default_section("seed")
    }
}

/// Settings of a seed run.
#[derive(Debug, Clone, Default)]
pub struct SeedOptions {
    pub config: SeedConfig,
}

/// One instance before it becomes a row.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub instance_id: String,
    pub repo_name: String,
    pub pr_number: i64,
    pub problem_statement: String,
    /// `issue` or `pr_text`.
    pub problem_source: String,
    /// Per file shown: `whole`, or `segments` (cut to fit the budget).
    pub prompt_context: BTreeMap<String, String>,
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
    /// The verify stage found tests that fail before the PR and pass after it.
    pub verified: bool,
    pub fail_to_pass: Vec<String>,
    pub pass_to_pass: Vec<String>,
    /// The environment the tests ran in (`environments.env_key`), "" when not verified.
    pub env_key: String,
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

/// A hash stable across runs and platforms, for the split and the file order.
fn fnv(s: &str, seed: u64) -> u64 {
    crate::hash::fnv1a(s.bytes(), crate::hash::OFFSET ^ seed)
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

/// A PR's raw material, read from the lake (a row of `sql/seed_prs.sql`, then its issues,
/// files and relevant files).
#[derive(Debug, Default, Clone, Deserialize)]
struct Material {
    repo_name: String,
    pr_number: i64,
    title: String,
    body: String,
    merged_at: Option<String>,
    base_sha: String,
    head_sha: String,
    merge_base: Option<String>,
    #[serde(skip)]
    issues: Vec<Issue>,
    #[serde(skip)]
    files: Vec<ChangedFile>,
    #[serde(skip)]
    relevant: Vec<Relevant>,
    #[serde(skip)]
    verification: Option<Verification>,
}

/// The verify stage's verdict on a PR (`pr_verification`), when it ran.
#[derive(Debug, Clone, Deserialize)]
struct Verification {
    repo_name: String,
    pr_number: i64,
    status: String,
    fail_to_pass: Vec<String>,
    pass_to_pass: Vec<String>,
    env_key: String,
}

/// A row of `sql/seed_issues.sql`.
#[derive(Debug, Clone, Deserialize)]
struct Issue {
    repo_name: String,
    pr_number: i64,
    issue_number: i64,
    title: String,
    body: String,
}

/// A row of `sql/seed_files.sql`.
#[derive(Debug, Clone, Deserialize)]
struct ChangedFile {
    repo_name: String,
    pr_number: i64,
    path: String,
    old_path: Option<String>,
    status: String,
    old_blob: Option<String>,
    new_blob: Option<String>,
    patch: String,
    is_binary: bool,
    language: Option<String>,
    old_mode: i64,
    new_mode: i64,
}

/// A row of `sql/seed_relevant.sql`.
#[derive(Debug, Clone, Deserialize)]
struct Relevant {
    repo_name: String,
    pr_number: i64,
    path: String,
    blob_sha: String,
}

/// A kept PR that could not become an instance (a row of `seed_rejections`).
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    pub repo_name: String,
    pub pr_number: i64,
    pub reason: String,
    pub detail: String,
}

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

async fn load_material(lake: &Lake) -> Result<BTreeMap<(String, i64), Material>> {
    let ctx = lake.session_with(&["pr_issue_links", "issues", "pr_relevant_files", "pr_verification"]).await?;
    async fn rows<T: serde::de::DeserializeOwned>(ctx: &SessionContext, sql: &str, name: &str) -> Result<Vec<T>> {
        crate::query::rows(ctx, sql).await.with_context(|| format!("sql/{name}"))
    }
    let mut m: BTreeMap<(String, i64), Material> = BTreeMap::new();
    for x in rows::<Material>(&ctx, PRS_SQL, "seed_prs.sql").await? {
        m.insert((x.repo_name.clone(), x.pr_number), x);
    }
    for i in rows::<Issue>(&ctx, ISSUES_SQL, "seed_issues.sql").await? {
        if let Some(x) = m.get_mut(&(i.repo_name.clone(), i.pr_number)) {
            x.issues.push(i);
        }
    }
    for f in rows::<ChangedFile>(&ctx, FILES_SQL, "seed_files.sql").await? {
        if let Some(x) = m.get_mut(&(f.repo_name.clone(), f.pr_number)) {
            x.files.push(f);
        }
    }
    for r in rows::<Relevant>(&ctx, RELEVANT_SQL, "seed_relevant.sql").await? {
        if let Some(x) = m.get_mut(&(r.repo_name.clone(), r.pr_number)) {
            x.relevant.push(r);
        }
    }
    let verified = "SELECT repo_name, pr_number, status, fail_to_pass, pass_to_pass, env_key FROM pr_verification";
    for v in rows::<Verification>(&ctx, verified, "pr_verification").await? {
        if let Some(x) = m.get_mut(&(v.repo_name.clone(), v.pr_number)) {
            x.verification = Some(v);
        }
    }
    Ok(m)
}

/// Contents of the needed blobs (UTF-8 text only).
async fn load_blobs(lake: &Lake, wanted: &[String]) -> Result<HashMap<String, String>> {
    if wanted.is_empty() || !lake.has_table(crate::lake::blobs::FILE_BLOBS).await? {
        return Ok(HashMap::new());
    }
    let ctx = lake.session().await?;
    let ids = RecordBatch::try_from_iter(vec![(
        "blob_sha",
        Arc::new(arrow::array::StringArray::from_iter_values(wanted)) as ArrayRef,
    )])?;
    ctx.register_batch("wanted_blobs", ids)?;
    let q = "SELECT b.blob_sha, b.content FROM file_blobs b JOIN wanted_blobs w ON w.blob_sha = b.blob_sha \
             WHERE b.content IS NOT NULL";
    Ok(crate::query::rows::<(String, String)>(&ctx, q).await?.into_iter().collect())
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
pub async fn build(lake: &Lake, cfg: &SeedConfig) -> Result<(Vec<Instance>, Vec<Rejection>, usize)> {
    let templates = Templates::load(cfg)?;
    let tokenizer = token_counter(cfg)?;
    let material = load_material(lake).await?;
    let mut wanted: Vec<String> = Vec::new();
    for x in material.values() {
        for f in &x.files {
            wanted.extend(f.old_blob.iter().cloned());
            wanted.extend(f.new_blob.iter().cloned());
        }
        wanted.extend(x.relevant.iter().map(|r| r.blob_sha.clone()));
    }
    wanted.sort();
    wanted.dedup();
    let blobs = load_blobs(lake, &wanted).await?;
    let mut instances = Vec::new();
    let mut rejected = Vec::new();
    let mut dropped_for_budget = 0;
    for x in material.values() {
        let reject = |reason: &str, detail: String| Rejection {
            repo_name: x.repo_name.clone(),
            pr_number: x.pr_number,
            reason: reason.to_string(),
            detail,
        };
        let problem = if x.issues.is_empty() {
            format!("{}\n\n{}", x.title, x.body)
        } else {
            x.issues.iter().map(|i| format!("{}\n\n{}", i.title, i.body)).collect::<Vec<_>>().join("\n\n---\n\n")
        };
        let mut context = BTreeMap::new();
        let mut oracle = BTreeMap::new();
        let mut patches = Vec::new();
        let mut changed = Vec::new();
        let mut missing = None;
        for ChangedFile { path, old_path, status, old_blob, new_blob, patch, is_binary, old_mode, new_mode, .. } in
            &x.files
        {
            // Only regular text files are shown and edited: a symlink's "content" is its target
            // path, a submodule has none here.
            let regular = |m: i64| m == 0 || crate::git::renames::is_regular(m as u32);
            if *is_binary || !regular(*old_mode) || !regular(*new_mode) {
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
            rejected.push(reject("no_text_change", "every changed file is binary, a symlink or a submodule".into()));
            continue;
        }
        let mut relevant: Vec<(String, String)> = x
            .relevant
            .iter()
            .filter(|r| !context.contains_key(&r.path) && !oracle.contains_key(&r.path))
            .filter_map(|r| blobs.get(&r.blob_sha).map(|c| (r.path.clone(), c.clone())))
            .collect();
        // Fit the budget: whole files first; then relevant files cut to the regions that match
        // the problem; then changed files cut to their hunks' regions too (every hunk's
        // original lines stay, so a correct SEARCH block can be written); then relevant files
        // dropped, least relevant first.
        let seed = fnv(&format!("{}#{}", x.repo_name, x.pr_number), cfg.shuffle_seed);
        let patches_by_path: HashMap<String, &str> =
            x.files.iter().map(|f| (f.old_path.clone().unwrap_or_else(|| f.path.clone()), f.patch.as_str())).collect();
        let cut_changed: BTreeMap<String, String> = context
            .iter()
            .map(|(p, c)| {
                let patch = patches_by_path.get(p).copied().unwrap_or("");
                (p.clone(), segments::cut(c, &segments::changed_regions(c, patch)))
            })
            .collect();
        let mut query = segments::words(&problem);
        for p in &changed {
            query.extend(segments::words(p));
        }
        let mut cut_relevant: Vec<String> =
            relevant.iter().map(|(_, c)| segments::cut(c, &segments::relevant_regions(c, &query))).collect();
        let mut level = 0;
        let (user, tokens, prompt_context) = loop {
            let mut shown: Vec<(&String, &String)> = Vec::new();
            let mut how: BTreeMap<String, String> = BTreeMap::new();
            for (p, c) in &context {
                let cut = &cut_changed[p];
                let segmented = level >= 2 && cut != c;
                shown.push((p, if segmented { cut } else { c }));
                how.insert(p.clone(), if segmented { "segments" } else { "whole" }.to_string());
            }
            for ((p, c), cut) in relevant.iter().zip(&cut_relevant) {
                let segmented = level >= 1 && cut != c;
                shown.push((p, if segmented { cut } else { c }));
                how.insert(p.clone(), if segmented { "segments" } else { "whole" }.to_string());
            }
            crate::rng::Rng::new(seed).shuffle(&mut shown);
            let user = templates.render_user(&x.repo_name, &problem, &templates.render_files(&shown));
            let tokens = count(&tokenizer, &templates.system)? + count(&tokenizer, &user)?;
            if tokens <= cfg.max_prompt_tokens {
                break (user, tokens, how);
            }
            if level < 2 {
                level += 1;
                continue;
            }
            if relevant.is_empty() {
                break (user, tokens, how);
            }
            relevant.pop();
            cut_relevant.pop();
            dropped_for_budget += 1;
        };
        if tokens > cfg.max_prompt_tokens {
            rejected.push(reject(
                "prompt_too_long",
                format!(
                    "{tokens} tokens > {} with the changed files cut to their hunks and no relevant files",
                    cfg.max_prompt_tokens
                ),
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
        let language = x.files.iter().filter_map(|f| f.language.clone()).next().unwrap_or_default();
        instances.push(Instance {
            instance_id: format!("{}#{}", x.repo_name, x.pr_number),
            repo_name: x.repo_name.clone(),
            pr_number: x.pr_number,
            problem_statement: problem,
            problem_source: if x.issues.is_empty() { "pr_text" } else { "issue" }.to_string(),
            prompt_context,
            context: full_context,
            oracle,
            oracle_patch: patches.join(""),
            system: templates.system.clone(),
            user,
            split: split_of(&x.repo_name, x.merged_at.as_deref().unwrap_or_default(), cfg).to_string(),
            changed_files: changed,
            relevant_files: relevant.iter().map(|(p, _)| p.clone()).collect(),
            issue_numbers: x.issues.iter().map(|i| i.issue_number).collect(),
            prompt_tokens: tokens,
            oracle_reward,
            base_sha: x.base_sha.clone(),
            merge_base: x.merge_base.clone().unwrap_or_default(),
            head_sha: x.head_sha.clone(),
            merged_at: x.merged_at.clone().unwrap_or_default(),
            language,
            verified: x.verification.as_ref().is_some_and(|v| v.status == "verified"),
            fail_to_pass: x.verification.as_ref().map(|v| v.fail_to_pass.clone()).unwrap_or_default(),
            pass_to_pass: x.verification.as_ref().map(|v| v.pass_to_pass.clone()).unwrap_or_default(),
            env_key: x.verification.as_ref().map(|v| v.env_key.clone()).unwrap_or_default(),
        });
    }
    instances.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    Ok((instances, rejected, dropped_for_budget))
}

/// Builds the seed dataset: `rl_seed`, the shards and `seed_rejections`.
pub async fn run(lake: &Lake, opts: &SeedOptions) -> Result<SeedSummary> {
    let cfg = &opts.config;
    for t in ["pr_quality", "pull_requests", "pr_snapshots", "pr_files"] {
        if !lake.has_table(t).await? {
            anyhow::bail!("no `{t}` table yet: run the filters and snapshots jobs first");
        }
    }
    let (instances, rejected, dropped) = build(lake, cfg).await?;
    let mut summary = SeedSummary { relevant_files_dropped_for_budget: dropped, ..Default::default() };
    for r in &rejected {
        *summary.rejected.entry(r.reason.clone()).or_default() += 1;
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
    let table = lake.ensure_contract_table(RL_SEED).await?;
    crate::lake::failpoint("commit.before:rl_seed");
    table
        .write(vec![batch.clone()])
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .context("writing rl_seed")?;
    crate::lake::failpoint("commit.after:rl_seed");
    summary.shards = write_shards(lake, &shard_batch(&batch)?, cfg.rows_per_shard).await?;
    crate::lake::failpoint("shards.after");

    let rej = rows::to_batch(SEED_REJECTIONS, &rejected)?;
    let t = lake.ensure_contract_table(SEED_REJECTIONS).await?;
    crate::lake::failpoint("commit.before:seed_rejections");
    t.write(vec![rej])
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .context("writing seed_rejections")?;
    crate::lake::failpoint("commit.after:seed_rejections");
    Ok(summary)
}
