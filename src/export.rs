//! Exports of the seed dataset (`rl_seed`) in the layouts of the tools people run, into a local
//! directory or a store URL:
//!
//! - `hf`: a Hugging Face dataset repository: `data/{train,test}-NNNNN-of-MMMMM.parquet` (the
//!   shards' columns, `schemas/seed_shards.toml`) and `README.md`, the dataset card with the
//!   YAML front matter the Hub and `datasets.load_dataset(DIR)` read (`configs` with each
//!   split's files, license, task categories, size category) and the card's charts beside it.
//! - `swebench`: `{train,test}.jsonl`, one SWE-bench task instance a line (the fields of
//!   `swebench.types.SWEbenchInstance`), which `swebench.harness.utils.load_swebench_dataset`
//!   loads, and a `README.md` saying what each field holds here.
//!
//! Not here: building the instances (the `seed` stage) or the card's figures (`report`).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

use crate::lake::Lake;
use crate::seed::{seed_schema, shard_batch, RL_SEED};

const SWEBENCH_SQL: &str = include_str!("../sql/export_swebench.sql");
const HINTS_SQL: &str = include_str!("../sql/export_hints.sql");

/// The splits of the seed dataset, in the order the card lists them.
pub const SPLITS: [&str; 2] = ["train", "test"];

/// What to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Hf,
    Swebench,
}

/// Settings of an export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub format: ExportFormat,
    /// A directory, or a store URL (`s3://bucket/datasets/seed`).
    pub out: String,
    /// Store options for `out` (`--storage-option`), over the environment's.
    pub storage_options: Vec<(String, String)>,
    /// Rows per Parquet file of the `hf` layout.
    pub rows_per_file: usize,
    /// How the archive's hours are judged in the card (the curation config's).
    pub completeness: crate::archive::CompletenessConfig,
    /// Only the instances whose tests the verify stage ran: some fail before and pass after.
    pub verified_only: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExportSummary {
    pub out: String,
    /// Instances per split.
    pub rows: BTreeMap<String, usize>,
    /// Every file written, where it is.
    pub files: Vec<String>,
    /// `swebench`: instances left out because every file they change is a test file, so
    /// SWE-bench's `patch` would be empty.
    pub only_tests: usize,
}

/// Writes the export.
pub async fn run(lake: &Lake, opts: &ExportOptions) -> Result<ExportSummary> {
    if !lake.has_table(RL_SEED).await? {
        bail!("no `rl_seed` table in {} yet: run the seed job first (swelake run --all)", lake.location());
    }
    crate::lake::runs::refuse_stale_seed(lake).await?;
    let target = Lake::open_with(&opts.out, &opts.storage_options)
        .with_context(|| format!("opening the export destination {}", opts.out))?;
    let mut summary = ExportSummary { out: target.location(), ..Default::default() };
    match opts.format {
        ExportFormat::Hf => hf(lake, &target, opts, &mut summary).await?,
        ExportFormat::Swebench => swebench(lake, &target, opts, &mut summary).await?,
    }
    Ok(summary)
}

async fn put(target: &Lake, rel: &str, bytes: Vec<u8>, summary: &mut ExportSummary) -> Result<()> {
    let (store, path) = target.object(rel);
    store.put(&path, bytes.into()).await.with_context(|| format!("writing {}", target.display_of(rel)))?;
    summary.files.push(target.display_of(rel));
    Ok(())
}

/// Removes the files under `dir` of an earlier export that this one did not write again
/// (an export with fewer files per split), so the directory holds one export.
async fn remove_stale(target: &Lake, dir: &str, written: &[String]) -> Result<()> {
    let (store, prefix) = target.object(dir);
    let listed: Vec<object_store::ObjectMeta> = futures::TryStreamExt::try_collect(store.list(Some(&prefix))).await?;
    for meta in listed {
        let name = meta.location.filename().unwrap_or_default().to_string();
        let ours = SPLITS.iter().any(|s| name.starts_with(&format!("{s}-"))) && name.ends_with(".parquet");
        if ours && !written.iter().any(|w| w.ends_with(&format!("/{name}"))) {
            store.delete(&meta.location).await.with_context(|| format!("removing the stale file {name}"))?;
        }
    }
    Ok(())
}

/// The rows of one split of `rl_seed` in instance order, in the table's own layout.
async fn split_rows(lake: &Lake, split: &str, verified_only: bool) -> Result<Vec<RecordBatch>> {
    let ctx = lake.session().await?;
    let verified = if verified_only { " AND verified" } else { "" };
    let sql = format!("SELECT * FROM {RL_SEED} WHERE split = '{split}'{verified} ORDER BY instance_id");
    let batches = ctx.sql(&sql).await?.collect().await.context("reading rl_seed")?;
    let schema = seed_schema();
    batches.iter().map(|b| crate::lake::writer::conform(&schema, b)).collect()
}

fn parquet_file(batch: &RecordBatch) -> Result<Vec<u8>> {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3)?))
        .build();
    let mut bytes = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(bytes)
}

/// The Hub's size category of a dataset of `n` rows.
pub fn size_category(n: usize) -> &'static str {
    match n {
        0..1_000 => "n<1K",
        1_000..10_000 => "1K<n<10K",
        10_000..100_000 => "10K<n<100K",
        100_000..1_000_000 => "100K<n<1M",
        1_000_000..10_000_000 => "1M<n<10M",
        _ => "10M<n<100M",
    }
}

async fn hf(lake: &Lake, target: &Lake, opts: &ExportOptions, summary: &mut ExportSummary) -> Result<()> {
    let per = opts.rows_per_file.max(1);
    let mut written = Vec::new();
    for split in SPLITS {
        let batches = split_rows(lake, split, opts.verified_only).await?;
        let schema = crate::seed::shard_schema();
        let shards: Vec<RecordBatch> = batches.iter().map(shard_batch).collect::<Result<_>>()?;
        let all = arrow::compute::concat_batches(&schema, &shards)?;
        let rows = all.num_rows();
        summary.rows.insert(split.to_string(), rows);
        // An empty split gets no file and no `configs` entry: `load_dataset` fails on a split
        // whose files hold no rows ("Instruction \"train\" corresponds to no data!").
        let files = rows.div_ceil(per);
        for i in 0..files {
            let start = i * per;
            let part = all.slice(start.min(rows), per.min(rows.saturating_sub(start)));
            let rel = format!("data/{split}-{i:05}-of-{files:05}.parquet");
            put(target, &rel, parquet_file(&part)?, summary).await?;
            written.push(target.display_of(&rel));
        }
    }
    remove_stale(target, "data", &written).await?;

    // The card and its charts, made by `report` in a scratch directory, then copied.
    let scratch = tempfile::Builder::new().prefix("swelake-export-").tempdir()?;
    let report = crate::report::run(
        lake,
        &crate::report::ReportOptions { out: scratch.path().to_path_buf(), completeness: opts.completeness.clone() },
    )
    .await?;
    for chart in &report.charts {
        let name = chart.file_name().and_then(|n| n.to_str()).context("a chart without a file name")?;
        put(target, name, std::fs::read(chart)?, summary).await?;
    }
    let card = std::fs::read_to_string(&report.card)?;
    // The card's own title names the lake's location, which means nothing where the export goes.
    let body = card.split_once('\n').filter(|(title, _)| title.starts_with("# ")).map_or(card.as_str(), |(_, b)| b);
    put(target, "README.md", hf_card(&summary.rows, body.trim_start()).into_bytes(), summary).await?;
    Ok(())
}

/// `README.md` of the `hf` layout: the Hub's YAML front matter, how to load it, then the card.
pub fn hf_card(rows: &BTreeMap<String, usize>, card: &str) -> String {
    let total: usize = rows.values().sum();
    let configs: String = SPLITS
        .iter()
        .filter(|s| rows.get(**s).copied().unwrap_or(0) > 0)
        .map(|s| format!("  - split: {s}\n    path: data/{s}-*\n"))
        .collect();
    let configs = if configs.is_empty() {
        String::new()
    } else {
        format!("configs:\n- config_name: default\n  data_files:\n{configs}")
    };
    let counts: String = SPLITS.iter().map(|s| format!("| {s} | {} |\n", rows.get(*s).copied().unwrap_or(0))).collect();
    format!(
        "---
license: other
license_name: per-repository
license_details: Each instance holds code and text of one GitHub repository, under that repository's license.
pretty_name: swelake SWE-RL seed
task_categories:
- text-generation
language:
- en
tags:
- code
- software-engineering
- reinforcement-learning
- swe-rl
size_categories:
- {size}
{configs}---

# swelake SWE-RL seed

Merged pull requests with the issues they resolve, the code they touch (before the change) and
the change itself, in the SWE-RL prompt format (facebookresearch/swe-rl), with verl-style
columns (`data_source`, `prompt` as a list of `{{role, content}}` messages, `ability`,
`reward_model` {{`style`, `ground_truth`}}, `extra_info`). `context`, `oracle` and
`prompt_context` are lists of `{{path, content}}`. `reward_model.ground_truth` holds all a
reward function needs to score an answer: score with the `swelake_reward` Python package
(`compute_score` for verl, `swerl_reward` for TRL).

| split | instances |
|---|---|
{counts}
```python
import datasets
ds = datasets.load_dataset(\"path/to/this/directory\")   # or the Hub repository's name
ds[\"train\"][0][\"prompt\"]
```

{card}",
        size = size_category(total),
    )
}

/// A row of `sql/export_swebench.sql`.
#[derive(Deserialize)]
struct SeedRow {
    instance_id: String,
    repo_name: String,
    split: String,
    problem_statement: String,
    oracle_patch: String,
    pr_number: i64,
    merge_base: String,
    base_sha: String,
    merged_at: String,
    created_at: Option<String>,
    verified: bool,
    fail_to_pass: Vec<String>,
    pass_to_pass: Vec<String>,
    env_key: String,
    package_version: Option<String>,
}

/// One SWE-bench task instance (`swebench.types.SWEbenchInstance`) and where it came from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SwebenchInstance {
    pub instance_id: String,
    pub repo: String,
    pub base_commit: String,
    pub patch: String,
    pub test_patch: String,
    pub problem_statement: String,
    pub hints_text: String,
    pub created_at: String,
    pub version: String,
    pub environment_setup_commit: String,
    #[serde(rename = "FAIL_TO_PASS")]
    pub fail_to_pass: String,
    #[serde(rename = "PASS_TO_PASS")]
    pub pass_to_pass: String,
    /// swelake's own: the seed's id (`owner/repo#N`), the PR number and the split.
    pub swelake_instance_id: String,
    pub pull_number: i64,
    pub split: String,
}

/// SWE-bench's rule for test files (`swebench.collect.utils.extract_patches`): the file's path
/// contains `test` (so also `tests`, `testing`) or `e2e`. The path is the old path of a
/// modified, renamed or deleted file and the new path of an added one, as `unidiff`'s
/// `PatchedFile.path`, which that rule reads.
pub fn is_test_path(path: &str) -> bool {
    crate::testfiles::is_test_path(path)
}

/// The path SWE-bench's rule looks at, from one file's section of a git patch.
fn section_path(section: &str) -> Option<&str> {
    let mut old = None;
    let mut new = None;
    for line in section.lines() {
        if line.starts_with("@@") {
            break;
        }
        if let Some(p) = line.strip_prefix("--- ") {
            old = Some(p);
        } else if let Some(p) = line.strip_prefix("+++ ") {
            new = Some(p);
        } else if let Some(p) = line.strip_prefix("rename from ") {
            return Some(p);
        }
    }
    match (old, new) {
        (Some("/dev/null"), Some(n)) => Some(n.strip_prefix("b/").unwrap_or(n)),
        (Some(o), _) => Some(o.strip_prefix("a/").unwrap_or(o)),
        // A header-only section (a mode change, a binary file): `diff --git a/P b/P`.
        _ => section.lines().next()?.strip_prefix("diff --git a/")?.split(" b/").next(),
    }
}

/// Splits a git patch into (non-test files, test files), each a patch of whole file sections.
pub fn split_patch(patch: &str) -> (String, String) {
    let (mut code, mut tests) = (String::new(), String::new());
    let mut starts: Vec<usize> = patch
        .match_indices("diff --git ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || patch.as_bytes()[i - 1] == b'\n')
        .collect();
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(patch.len());
        let section = &patch[start..end];
        if section.is_empty() {
            continue;
        }
        let out = if section_path(section).is_some_and(is_test_path) { &mut tests } else { &mut code };
        out.push_str(section);
    }
    (code, tests)
}

/// The SWE-bench instances of the lake's seed: (instances, those left out for changing only
/// test files).
pub async fn swebench_instances(lake: &Lake, verified_only: bool) -> Result<(Vec<SwebenchInstance>, usize)> {
    let ctx = lake.session_with(&["pull_requests", "pr_issue_links", "events", "pr_verification"]).await?;
    let rows: Vec<SeedRow> = crate::query::rows(&ctx, SWEBENCH_SQL).await.context("sql/export_swebench.sql")?;
    let hint_rows: Vec<(String, i64, String, String)> =
        crate::query::rows(&ctx, HINTS_SQL).await.context("sql/export_hints.sql")?;
    let mut hints: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, _, _, body) in hint_rows {
        hints.entry(id).or_default().push(body);
    }
    let mut out = Vec::new();
    let mut only_tests = 0;
    for r in rows {
        if verified_only && !r.verified {
            continue;
        }
        let (patch, test_patch) = split_patch(&r.oracle_patch);
        if patch.is_empty() {
            only_tests += 1;
            continue;
        }
        let (owner, name) = r.repo_name.split_once('/').unwrap_or(("", r.repo_name.as_str()));
        let base = if r.merge_base.is_empty() { r.base_sha.clone() } else { r.merge_base.clone() };
        out.push(SwebenchInstance {
            instance_id: format!("{owner}__{name}-{}", r.pr_number),
            repo: r.repo_name.clone(),
            base_commit: base.clone(),
            patch,
            test_patch,
            problem_statement: r.problem_statement,
            hints_text: hints.remove(&r.instance_id).unwrap_or_default().join("\n"),
            created_at: r.created_at.unwrap_or(r.merged_at),
            // SWE-bench groups instances by the package's version (major.minor); without a stated
            // version, the environment they ran in is what groups them.
            version: match r.package_version.as_deref().filter(|v| !v.is_empty()) {
                Some(v) => crate::verify::python::spec::major_minor(v),
                None => r.env_key.clone(),
            },
            environment_setup_commit: base,
            fail_to_pass: serde_json::to_string(&r.fail_to_pass)?,
            pass_to_pass: serde_json::to_string(&r.pass_to_pass)?,
            swelake_instance_id: r.instance_id,
            pull_number: r.pr_number,
            split: r.split,
        });
    }
    Ok((out, only_tests))
}

async fn swebench(lake: &Lake, target: &Lake, opts: &ExportOptions, summary: &mut ExportSummary) -> Result<()> {
    let (instances, only_tests) = swebench_instances(lake, opts.verified_only).await?;
    summary.only_tests = only_tests;
    for split in SPLITS {
        let mut text = String::new();
        let mut n = 0;
        for i in instances.iter().filter(|i| i.split == split) {
            text.push_str(&serde_json::to_string(i)?);
            text.push('\n');
            n += 1;
        }
        summary.rows.insert(split.to_string(), n);
        put(target, &format!("{split}.jsonl"), text.into_bytes(), summary).await?;
    }
    put(target, "README.md", swebench_card(&summary.rows, only_tests).into_bytes(), summary).await?;
    Ok(())
}

/// `README.md` of the `swebench` layout: what each field holds, and what it does not.
pub fn swebench_card(rows: &BTreeMap<String, usize>, only_tests: usize) -> String {
    let counts: String =
        SPLITS.iter().map(|s| format!("| {s}.jsonl | {} |\n", rows.get(*s).copied().unwrap_or(0))).collect();
    format!(
        "# swelake seed as SWE-bench task instances

One JSON line per instance, with the fields of SWE-bench (`swebench.types.SWEbenchInstance`);
`swebench.harness.utils.load_swebench_dataset(\"train.jsonl\")` loads a file as it is.

| file | instances |
|---|---|
{counts}
{only_tests} seed instances that change only test files are left out (their `patch` would be empty).

| field | here |
|---|---|
| `instance_id` | `owner__repo-N`, N the pull request's number |
| `repo` | `owner/repo` |
| `base_commit` | the merge base of the pull request: the commit its change applies to (`git apply` of `patch` and `test_patch` there succeeds) |
| `patch` | the pull request's change to non-test files |
| `test_patch` | its change to test files: a file whose path (the old path; the new one of an added file) contains `test` or `e2e`, SWE-bench's own rule |
| `problem_statement` | the linked issues' titles and bodies (the pull request's own when no linked issue has text) |
| `hints_text` | comments on the linked issues written before the pull request was opened, oldest first |
| `created_at` | when the pull request was opened (merged, for pull requests found only in git) |
| `version` | the package's version at `base_commit` (major.minor), else the key of the environment its tests ran in (`environments.env_key`), else empty |
| `environment_setup_commit` | `base_commit`: the environment is resolved from what the tree declares there, as of the PR's day |
| `FAIL_TO_PASS`, `PASS_TO_PASS` | JSON lists, as SWE-bench stores them, from `swelake run verify`: tests that fail before the code change and pass after it, and tests that pass on both sides, each stable over repeated runs in a sandbox. `\"[]\"` for an instance that was not verified (`export --verified-only` leaves those out); grade predictions with `swelake evaluate` |

Besides: `swelake_instance_id` (`owner/repo#N`, the `rl_seed` key), `pull_number`, `split`.
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/src/app.py b/src/app.py
index 1..2 100644
--- a/src/app.py
+++ b/src/app.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/tests/test_app.py b/tests/test_app.py
new file mode 100644
index 0..3
--- /dev/null
+++ b/tests/test_app.py
@@ -0,0 +1 @@
+assert True
diff --git a/old_testing.py b/renamed.py
similarity index 100%
rename from old_testing.py
rename to renamed.py
diff --git a/bin/tool b/bin/tool
old mode 100644
new mode 100755
";

    #[test]
    fn a_patch_splits_by_swebench_test_rule_keeping_whole_sections() {
        let (code, tests) = split_patch(PATCH);
        assert!(code.starts_with("diff --git a/src/app.py b/src/app.py\n"), "{code}");
        assert!(code.contains("diff --git a/bin/tool b/bin/tool\nold mode 100644\nnew mode 100755\n"), "{code}");
        assert!(!code.contains("test"), "{code}");
        assert!(tests.starts_with("diff --git a/tests/test_app.py"), "{tests}");
        assert!(tests.contains("rename from old_testing.py\nrename to renamed.py\n"), "{tests}");
        assert_eq!(code.len() + tests.len(), PATCH.len());
        assert_eq!(split_patch(""), (String::new(), String::new()));
    }

    #[test]
    fn size_categories_follow_the_hub() {
        assert_eq!(size_category(0), "n<1K");
        assert_eq!(size_category(999), "n<1K");
        assert_eq!(size_category(1_000), "1K<n<10K");
        assert_eq!(size_category(500_000), "100K<n<1M");
    }
}
