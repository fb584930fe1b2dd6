//! Curation: quality filters on crafted PRs (one per reason code, and people whose names look
//! like bots), relevance with the real ONNX model, the seed dataset read back by other
//! readers, and the dataset card.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use swelake::jobs::{run, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::{count, pairs, quiet_ingest};

/// Writes rows (JSON objects) into a lake table with the columns of its schema file.
async fn put(lake: &Lake, table: &str, rows: &[Value]) {
    let schema = swelake::schema::arrow(table).unwrap();
    let text: String = rows.iter().map(|r| r.to_string() + "\n").collect();
    let reader = arrow::json::ReaderBuilder::new(schema.clone()).build(std::io::Cursor::new(text)).unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let t = lake.ensure_table(table, &schema, &[]).await.unwrap();
    lake.append(t, batches).await.unwrap();
}

fn pr(repo: &str, n: i64, title: &str, author: &str, kind: &str, merged: Option<bool>) -> Value {
    json!({"repo_name": repo, "number": n, "title": title, "body": "A change.", "author_login": author, "author_type": kind,
           "merged": merged, "merge_source": "pull_request_event", "metadata_source": "pull_request_event", "timeline_events": 1,
           "discovery_source": "gh_archive"})
}

fn file(repo: &str, n: i64, path: &str, lines: i64, patch: &str, language: Option<&str>) -> Value {
    json!({"repo_name": repo, "pr_number": n, "path": path, "status": "M", "old_mode": 33188, "new_mode": 33188,
           "additions": lines, "deletions": 0, "is_binary": false, "language": language, "patch": patch,
           "merge_base": "b", "head_sha": "h"})
}

#[tokio::test(flavor = "multi_thread")]
async fn one_pr_per_reason_code_and_people_who_look_like_bots() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let r = "acme/app";
    let code = |n: i64| file(r, n, &format!("src/m{n}.py"), 3, "@@ -1 +1 @@\n-a = 1\n+a = 2\n", Some("Python"));
    let mut prs = vec![
        (pr(r, 1, "Fix crash on empty input", "mira", "User", Some(true)), vec![]),
        (pr(r, 2, "Fix crash", "mira", "User", Some(false)), vec!["not_merged"]),
        (pr(r, 3, "Update deps", "dependabot[bot]", "Bot", Some(true)), vec!["bot_author"]),
        (pr(r, 4, "Fix crash", "release-bot", "User", Some(true)), vec!["bot_author"]),
        (pr(r, 5, "Fix crash", "talbot", "User", Some(true)), vec![]),
        (pr(r, 6, "Bump lodash from 4.17.20 to 4.17.21", "mira", "User", Some(true)), vec!["bot_text"]),
        (pr(r, 7, "Fix bumpy scrolling", "abbott", "User", Some(true)), vec![]),
        (pr(r, 8, "Fix crash", "mira", "User", Some(true)), vec!["empty_change"]),
        (pr(r, 9, "Fix crash", "mira", "User", Some(true)), vec!["too_many_files"]),
        (pr(r, 10, "Fix crash", "mira", "User", Some(true)), vec!["too_many_lines"]),
        (pr(r, 11, "Fix crash", "mira", "User", Some(true)), vec!["no_code_change"]),
        (pr(r, 12, "Fix crash", "mira", "User", Some(true)), vec!["no_code_change", "noise_only"]),
        (pr(r, 13, "Fix crash", "mira", "User", Some(true)), vec!["noise_only"]),
        (pr("django/django", 14, "Fix crash", "mira", "User", Some(true)), vec!["decontaminated"]),
        (pr(r, 15, "Fix crash", "mira", "User", Some(true)), vec!["no_linked_issue"]),
        (pr(r, 16, "Fix crash", "mira", "User", Some(true)), vec!["issue_text_too_short"]),
        // Not snapshotted (or failed) and not in a timeline: the links job has not read their
        // texts.
        (pr(r, 17, "Fix crash", "mira", "User", Some(true)), vec!["no_linked_issue", "not_snapshotted"]),
        (pr(r, 18, "Fix crash", "mira", "User", Some(true)), vec!["no_linked_issue", "snapshot_failed"]),
        (pr(r, 19, "Fix crash", "mira", "User", None), vec!["not_merged"]),
        // Linked issues without text in the lake: the PR's own text is judged.
        (pr(r, 20, "Fix crash", "mira", "User", Some(true)), vec!["pr_text_too_short"]),
        (
            {
                let mut p = pr(r, 21, "Fix crash on empty input", "mira", "User", Some(true));
                p["body"] = json!("run([]) raised IndexError; it returns an empty list now.");
                p
            },
            vec![],
        ),
    ];
    prs.sort_by_key(|p| p.0["number"].as_i64());
    let mut files = Vec::new();
    for n in [1, 2, 3, 4, 5, 6, 7, 10, 15, 16, 17, 18, 19, 20, 21] {
        files.push(code(n));
    }
    files.push(file("django/django", 14, "src/m14.py", 3, "@@ -1 +1 @@\n-a = 1\n+a = 2\n", Some("Python")));
    for i in 0..16 {
        files.push(file(r, 9, &format!("src/f{i}.py"), 1, "@@ -1 +1 @@\n-a\n+b\n", Some("Python")));
    }
    files.push(file(r, 10, "src/big.py", 5000, "", Some("Python")));
    files.push(file(r, 11, "README.md", 2, "@@ -1 +1 @@\n-old words\n+new words\n", None));
    files.push(file(r, 12, "package-lock.json", 40, "", None));
    // A version-only change of a code file: noise, but code.
    files.push(file(
        r,
        13,
        "pkg/version.py",
        1,
        "@@ -1 +1 @@\n-__version__ = \"1.2.3\"\n+__version__ = \"1.2.4\"\n",
        Some("Python"),
    ));
    let mut snaps = Vec::new();
    // The links are found by the pr_issue_links job in the PRs' bodies (PR 15 references none).
    for (p, _) in prs.iter_mut() {
        let (repo, n) = (p["repo_name"].as_str().unwrap().to_string(), p["number"].as_i64().unwrap());
        if n != 17 {
            snaps.push(json!({"repo_name": repo, "pr_number": n, "status": if n == 18 { "error" } else { "ok" }, "base_sha": "a",
                              "head_sha": "h", "files": 1, "commits": 1, "snapshotted_at": "2025-01-01T00:00:00Z"}));
        }
        let issue = match n {
            16 => 900,
            20 | 21 => 901,
            _ => 100,
        };
        if n != 15 {
            p["body"] = json!(format!("{} Fixes #{issue}", p["body"].as_str().unwrap()));
        }
    }
    let issues = vec![
        json!({"repo_name": r, "number": 100, "title": "Crash on empty input", "body": "Calling run([]) raises IndexError instead of returning an empty result.",
               "is_pull_request": false, "last_event_at": "2025-01-01T00:00:00Z", "last_event_id": "1"}),
        json!({"repo_name": "django/django", "number": 100, "title": "Crash on empty input", "body": "Calling run([]) raises IndexError instead of returning an empty result.",
               "is_pull_request": false, "last_event_at": "2025-01-01T00:00:00Z", "last_event_id": "2"}),
        json!({"repo_name": r, "number": 900, "title": "bug", "body": "fix", "is_pull_request": false,
               "last_event_at": "2025-01-01T00:00:00Z", "last_event_id": "3"}),
    ];
    put(&lake, "pull_requests", &prs.iter().map(|p| p.0.clone()).collect::<Vec<_>>()).await;
    put(&lake, "pr_files", &files).await;
    put(&lake, "pr_snapshots", &snaps).await;
    put(&lake, "issues", &issues).await;

    let registry = Registry::load(None, None).unwrap();
    let out =
        run(&lake, &registry, &["filters".to_string()], &RunOptions { all: true, ..Default::default() }).await.unwrap();
    let filters = out.iter().find(|s| s.job == "filters").unwrap();

    let got: BTreeMap<i64, Vec<String>> =
        pairs(&lake, "SELECT array_to_string(reasons, ','), pr_number FROM pr_quality")
            .await
            .into_iter()
            .map(|(r, n)| (n, r.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()))
            .collect();
    for (p, want) in &prs {
        let n = p["number"].as_i64().unwrap();
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(got[&n], want, "PR {n} ({})", p["author_login"]);
    }
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pr_quality WHERE keep").await,
        4,
        "1, 5 (talbot), 7 (abbott, \"bumpy\") and 21 (its own text)"
    );
    assert_eq!(
        pairs(&lake, "SELECT problem_source, count(*) FROM pr_quality WHERE keep GROUP BY 1 ORDER BY 1").await,
        vec![("issue".to_string(), 3), ("pr_text".to_string(), 1)]
    );
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_quality WHERE NOT keep AND cardinality(reasons) = 0").await, 0);
    // The job prints its counts per reason.
    assert_eq!(filters.notes["reason:no_code_change"], 2);
    assert_eq!(filters.notes["kept"], 4);
    // Nothing changed: nothing to do.
    let again =
        run(&lake, &registry, &["filters".to_string()], &RunOptions { all: true, ..Default::default() }).await.unwrap();
    assert!(again.iter().find(|s| s.job == "filters").unwrap().partitions.is_empty());
}

/// Runs the whole pipeline on the sample hours and repositories into a fresh lake.
pub(crate) async fn sample_lake(
    dir: &Path,
    config: Option<swelake::jobs::CurationConfig>,
) -> (Lake, Vec<swelake::jobs::JobSummary>) {
    let lake = Lake::open(dir.join("lake").to_str().unwrap()).unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    swelake::ingest::run(&lake, &quiet_ingest(&samples)).await.unwrap();
    let repos = dir.join("repos");
    swelake::samples::create_repos(&repos).unwrap();
    let mirrors = swelake::git::Mirrors::new(format!("{}/{{repo}}.git", repos.display()), dir.join("mirrors"));
    let registry = Registry::load(None, None).unwrap();
    let all: Vec<String> = registry.jobs.keys().cloned().collect();
    let opts = RunOptions {
        all: true,
        git: Some(swelake::jobs::GitOptions::new(mirrors)),
        curation: config.unwrap_or_default(),
        ..Default::default()
    };
    let s = run(&lake, &registry, &all, &opts).await.unwrap();
    (lake, s)
}

fn read_parquet(path: &Path) -> arrow::array::RecordBatch {
    let f = std::fs::File::open(path).unwrap();
    let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap().build().unwrap();
    let batches: Vec<_> = r.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// SEARCH/REPLACE edits written from a git patch (independent of the seed code): each hunk of
/// a modified file searches its old lines and replaces them by its new lines; a created,
/// deleted or renamed file is written whole (the old content replaced by nothing, the new
/// content under an empty SEARCH), as the prompt's instructions say.
pub(crate) fn edits_from_patch(
    patch: &str,
    context: &BTreeMap<String, String>,
    oracle: &BTreeMap<String, String>,
) -> String {
    fn block(path: &str, search: &str, replace: &str) -> String {
        format!("```\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```")
    }
    let mut out = Vec::new();
    for section in patch.split("diff --git ").filter(|s| !s.trim().is_empty()) {
        let lines: Vec<&str> = section.lines().collect();
        let old = lines.iter().find_map(|l| l.strip_prefix("--- ")).map(|p| p.trim_start_matches("a/"));
        let new = lines.iter().find_map(|l| l.strip_prefix("+++ ")).map(|p| p.trim_start_matches("b/"));
        let rename_from = lines.iter().find_map(|l| l.strip_prefix("rename from "));
        let rename_to = lines.iter().find_map(|l| l.strip_prefix("rename to "));
        let (old, new) = (rename_from.or(old).unwrap_or("/dev/null"), rename_to.or(new).unwrap_or("/dev/null"));
        if old != new {
            if old != "/dev/null" && !context[old].is_empty() {
                out.push(block(old, &context[old], ""));
            }
            if new != "/dev/null" && !oracle[new].is_empty() {
                out.push(block(new, "", &oracle[new]));
            }
            continue;
        }
        let (mut o, mut n): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
        let mut in_hunk = false;
        for line in &lines {
            if line.starts_with("@@") {
                if !o.is_empty() || !n.is_empty() {
                    out.push(block(old, &o.join("\n"), &n.join("\n")));
                }
                o.clear();
                n.clear();
                in_hunk = true;
            } else if !in_hunk || line.starts_with('\\') {
                continue;
            } else if let Some(l) = line.strip_prefix('-') {
                o.push(l);
            } else if let Some(l) = line.strip_prefix('+') {
                n.push(l);
            } else if let Some(l) = line.strip_prefix(' ') {
                o.push(l);
                n.push(l);
            }
        }
        if !o.is_empty() || !n.is_empty() {
            out.push(block(old, &o.join("\n"), &n.join("\n")));
        }
    }
    format!("<think>\nfrom the patch\n</think>\n<solution>\n{}\n</solution>", out.join("\n"))
}

#[tokio::test(flavor = "multi_thread")]
async fn sample_pipeline_builds_relevant_files_seed_shards_and_card() {
    let dir = tempfile::tempdir().unwrap();
    let (lake, summaries) = sample_lake(dir.path(), None).await;
    let seed = summaries.iter().find(|s| s.job == "seed").unwrap();
    assert_eq!(seed.notes["instances"], 3, "{summaries:?}");

    // Relevance ran with the real MiniLM model through ONNX Runtime.
    let models: BTreeSet<String> =
        pairs(&lake, "SELECT DISTINCT model, 1 FROM pr_relevant_files").await.into_iter().map(|x| x.0).collect();
    // One model per run, named with its encoder and the weights it ranked with: the sample
    // repositories have too few earlier PRs to learn from, so the config's.
    assert_eq!(models.len(), 1, "{models:?}");
    let model = models.first().unwrap();
    assert!(model.starts_with("hybrid-minilm+all-MiniLM-L6-v2-int8 [first stage config: bm25=1.210,"), "{model}");
    assert!(model.contains("top 10 re-ranked config:") && model.contains("embedding=0.750"), "{model}");
    // Relevant files are never files the PR changed, and their contents are in file_blobs.
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pr_relevant_files r JOIN pr_files f ON f.repo_name = r.repo_name AND f.pr_number = r.pr_number AND (f.path = r.path OR f.old_path = r.path)").await,
        0
    );
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_relevant_files r LEFT JOIN file_blobs b ON b.blob_sha = r.blob_sha WHERE b.content IS NULL").await, 0);
    // calc#2 changes calc/ops.py and its test: the module that imports it ranks first.
    let top = pairs(&lake, "SELECT path, rank FROM pr_relevant_files WHERE repo_name = 'swelake-samples/calc' AND pr_number = 2 ORDER BY rank").await;
    assert_eq!(top[0].0, "calc/__init__.py", "{top:?}");

    // The shards read back with the parquet crate.
    let shard = lake.local_root().unwrap().join("shards/seed/part-00000.parquet");
    let b = read_parquet(&shard);
    assert_eq!(b.num_rows(), 3);
    for col in [
        "instance_id",
        "problem_statement",
        "context",
        "oracle",
        "oracle_patch",
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    ] {
        assert!(b.schema().index_of(col).is_ok(), "{col}");
    }
    use arrow::array::AsArray;
    let ids = b.column_by_name("instance_id").unwrap().as_string::<i32>();
    let patches = b.column_by_name("oracle_patch").unwrap().as_string::<i32>();
    let prompts = b.column_by_name("prompt").unwrap().as_list::<i32>();
    let rm = b.column_by_name("reward_model").unwrap().as_struct();
    let gt = rm.column_by_name("ground_truth").unwrap().as_string::<i32>();
    for r in 0..b.num_rows() {
        let truth: Value = serde_json::from_str(gt.value(r)).unwrap();
        let context: BTreeMap<String, String> = serde_json::from_value(truth["context"].clone()).unwrap();
        let oracle: BTreeMap<String, String> = serde_json::from_value(truth["oracle"].clone()).unwrap();
        // The oracle, as SEARCH/REPLACE edits built from the patch, earns reward 1.0.
        let answer = edits_from_patch(patches.value(r), &context, &oracle);
        let reward = swelake::reward::search_replace_reward(&context, &oracle, &answer).unwrap();
        assert_eq!(reward.reward, 1.0, "{}: {answer}\n{reward:?}", ids.value(r));
        // The prompt: a system message asking for <think>/<solution>, and a user message with
        // the issue and every context file.
        let msgs = prompts.value(r);
        let msgs = msgs.as_struct();
        let roles = msgs.column_by_name("role").unwrap().as_string::<i32>();
        let contents = msgs.column_by_name("content").unwrap().as_string::<i32>();
        assert_eq!((roles.value(0), roles.value(1)), ("system", "user"));
        assert!(contents.value(0).contains("<think>") && contents.value(0).contains("<solution>"));
        for path in context.keys() {
            assert!(contents.value(1).contains(&format!("### {path}\n")), "{path} shown");
        }
        assert!(contents.value(1).contains("<<<<<<< SEARCH"));
    }
    // The tables agree with their schema files.
    crate::common::assert_tables_match_schemas(
        &lake,
        &["pr_quality", "pr_relevant_files", "blob_embeddings", "rl_seed", "seed_rejections"],
    )
    .await;
    // One repository, one split.
    assert_eq!(
        count(
            &lake,
            "SELECT count(*) FROM (SELECT repo_name FROM rl_seed GROUP BY repo_name HAVING count(DISTINCT split) > 1)"
        )
        .await,
        0
    );

    // pyarrow reads the shards too, when it is installed.
    let py = std::process::Command::new("python3")
        .args(["-c", "import sys, pyarrow.parquet as pq; t = pq.read_table(sys.argv[1]); print(t.num_rows, t.column('prompt')[0][0]['role'])"])
        .arg(&shard)
        .output();
    if let Ok(out) = py {
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3 system");
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("No module named 'pyarrow'"), "pyarrow failed: {err}");
        }
    }

    trainers_tools_open_the_seed(&lake, dir.path()).await;

    // The dataset card.
    let card = swelake::report::run(
        &lake,
        &swelake::report::ReportOptions { out: dir.path().join("card"), completeness: Default::default() },
    )
    .await
    .unwrap()
    .card;
    let text = std::fs::read_to_string(&card).unwrap();
    assert!(text.contains("bot_author") && text.contains("![languages](languages.png)"));
    // Where the data came from: the PRs' source, the problem statements', the archive's hours.
    assert!(text.contains("## Sources") && text.contains("| merged PRs found in gh_archive |"), "{text}");
    assert!(text.contains("instances whose problem statement is issue"), "{text}");
    assert!(text.contains("GH Archive hours ") && text.contains(" ingested, "), "{text}");
    // The funnel, whose figures are the tables' own.
    let instances = count(&lake, "SELECT count(*) FROM rl_seed").await;
    let merged = count(&lake, "SELECT count(*) FROM pull_requests WHERE merged").await;
    assert!(text.contains(&format!("| merged | {merged} |")), "{text}");
    assert!(text.contains(&format!("| seed instances | {instances} |")), "{text}");
    assert!(text.contains("| repository | merged | kept | instances |"), "{text}");
    for png in [
        "rejections.png",
        "files_per_pr.png",
        "lines_per_pr.png",
        "languages.png",
        "prompt_tokens.png",
        "links_per_pr.png",
    ] {
        let bytes = std::fs::read(dir.path().join("card").join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
}

/// The relevance stage's tables, every row and column, in key order.
async fn relevance_tables(lake: &Lake) -> String {
    let ctx = lake.session().await.unwrap();
    let mut out = String::new();
    for sql in [
        "SELECT * FROM pr_relevant_files ORDER BY repo_name, pr_number, rank",
        "SELECT * FROM blob_embeddings ORDER BY blob_sha, model, chunk",
        "SELECT * FROM relevance_models ORDER BY repo_name",
    ] {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        out.push_str(&arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string());
    }
    out
}

/// Same lake, same relevance tables: two clean runs, and runs with 1 and 2 threads, give the
/// same rows to the last bit (floats print at full precision), with a fit on the repository's
/// history as well as with the config's weights.
#[tokio::test(flavor = "multi_thread")]
async fn relevance_tables_are_the_same_on_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = swelake::jobs::CurationConfig::default();
    // The sample histories are short: let them buy a fit.
    config.relevance.min_train_cases = 1;
    config.relevance.fit_cases_per_pr = 100;
    let (lake, _) = sample_lake(dir.path(), Some(config.clone())).await;
    let first = relevance_tables(&lake).await;
    assert!(first.contains("| fitted "), "a repository is ranked by a fit:\n{first}");
    assert!(first.contains("| config "), "and one by the config's weights:\n{first}");
    let root = lake.local_root().unwrap();
    let mirrors = swelake::git::Mirrors::new(
        format!("{}/{{repo}}.git", dir.path().join("repos").display()),
        dir.path().join("mirrors"),
    );
    for threads in [1, 2] {
        for t in ["pr_relevant_files", "blob_embeddings", "relevance_models"] {
            std::fs::remove_dir_all(root.join(t)).unwrap();
        }
        let scope = swelake::git::Scope { threads, ..swelake::git::Scope::new(mirrors.clone()) };
        let opts = swelake::relevance::RelevanceOptions { scope, config: config.relevance.clone() };
        let s = swelake::relevance::run(&lake, &opts).await.unwrap();
        assert!(s.prs > 0 && s.embedded_chunks > 0, "{s:?}");
        assert_eq!(relevance_tables(&lake).await, first, "a clean run with {threads} threads");
    }
}

/// Instances per split of the lake's `rl_seed`.
pub(crate) async fn split_counts(lake: &Lake) -> BTreeMap<String, i64> {
    let mut counts: BTreeMap<String, i64> = [("train".to_string(), 0), ("test".to_string(), 0)].into();
    counts.extend(pairs(lake, "SELECT split, count(*) FROM rl_seed GROUP BY split").await);
    counts
}

/// What reaches trainers opens in their own tools: the shards in Hugging Face `datasets` (as
/// verl and TRL load them), the `hf` export with `load_dataset(DIR)`, the `swebench` export with
/// SWE-bench's loader, and the reward wheel's tests, with every instance's oracle answer
/// scored through `compute_score`.
async fn trainers_tools_open_the_seed(lake: &Lake, dir: &Path) {
    let Some(py) = crate::python::python() else { return };
    let shards = lake.local_root().unwrap().join("shards/seed/*.parquet");
    let shards = shards.to_str().unwrap();
    let loaded: Value =
        serde_json::from_str(crate::python::script(&py, "load_shards.py", &[shards], &[]).trim()).unwrap();
    assert_eq!(loaded["rows"], count(lake, "SELECT count(*) FROM rl_seed").await);

    let counts = split_counts(lake).await;
    let export = |format, out: &Path| swelake::export::ExportOptions {
        format,
        out: out.to_str().unwrap().to_string(),
        storage_options: vec![],
        rows_per_file: 2,
        completeness: Default::default(),
        verified_only: false,
    };
    let hf = dir.join("export-hf");
    let s = swelake::export::run(lake, &export(swelake::export::ExportFormat::Hf, &hf)).await.unwrap();
    assert!(hf.join("README.md").exists() && hf.join("languages.png").exists(), "{s:?}");
    let card = std::fs::read_to_string(hf.join("README.md")).unwrap();
    assert!(card.starts_with("---\nlicense: other\n") && card.contains("  - split: test\n    path: data/test-*\n"));
    assert!(card.contains("size_categories:\n- n<1K\n") && card.contains("task_categories:\n- text-generation\n"));
    let loaded: Value =
        serde_json::from_str(crate::python::script(&py, "load_hf_export.py", &[hf.to_str().unwrap()], &[]).trim())
            .unwrap();
    assert_eq!(loaded, json!(counts), "load_dataset(DIR) splits");
    // A second export with one file per split replaces the first's files.
    let again = export(swelake::export::ExportFormat::Hf, &hf);
    swelake::export::run(lake, &swelake::export::ExportOptions { rows_per_file: 100, ..again }).await.unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(hf.join("data")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["test-00000-of-00001.parquet", "train-00000-of-00001.parquet"]);

    let sb = dir.join("export-swebench");
    let s = swelake::export::run(lake, &export(swelake::export::ExportFormat::Swebench, &sb)).await.unwrap();
    let files = [sb.join("train.jsonl"), sb.join("test.jsonl")];
    let files: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let loaded = crate::python::script(&py, "load_swebench.py", &files, &[]);
    assert_eq!(loaded.lines().count() + s.only_tests, counts.values().sum::<i64>() as usize, "{loaded}");
    // Not verified (the sample lake's PRs have no tests to run): the lists are empty, and the
    // card says where they come from.
    assert!(std::fs::read_to_string(sb.join("README.md")).unwrap().contains("swelake run verify"));
    for line in loaded.lines() {
        let inst: Value = serde_json::from_str(line).unwrap();
        assert_eq!((&inst["FAIL_TO_PASS"], &inst["PASS_TO_PASS"]), (&json!([]), &json!([])), "{line}");
    }

    // The wheel's own tests, in a clean venv: parity through every entry point, and the
    // shards' oracles.
    let (_venv, clean) = crate::python::clean_venv().unwrap();
    let out = std::process::Command::new(&clean)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/swelake-reward/python/tests"))
        .env("SWELAKE_SEED_SHARDS", shards)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pytest:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(" passed") && !text.contains("skipped"), "{text}");
    eprintln!("pytest of the swelake_reward wheel: {}", text.lines().last().unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_budget_drops_relevant_files_then_skips() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = swelake::jobs::CurationConfig::load(None).unwrap();
    // Unbounded, the sample prompts are 536-662 tokens; with 520 two instances cannot fit even
    // without their relevant files, and calc#2 fits only by dropping its relevant files.
    config.seed.max_prompt_tokens = 520;
    let (lake, summaries) = sample_lake(dir.path(), Some(config)).await;
    let seed = summaries.iter().find(|s| s.job == "seed").unwrap();
    assert!(seed.notes["relevant_files_dropped_for_budget"] > 0, "{seed:?}");
    assert_eq!(seed.notes.get("rejected:prompt_too_long").copied(), Some(2), "{seed:?}");
    let kept = pairs(&lake, "SELECT instance_id, extra_info['prompt_tokens'] FROM rl_seed").await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].0, "swelake-samples/calc#2");
    assert!(kept[0].1 <= 520, "{kept:?}");
    assert_eq!(count(&lake, "SELECT cardinality(extra_info['relevant_files']) FROM rl_seed").await, 0);
    let rejected = pairs(&lake, "SELECT repo_name || '#' || CAST(pr_number AS VARCHAR), 1 FROM seed_rejections WHERE reason = 'prompt_too_long' ORDER BY 1").await;
    assert_eq!(
        rejected.into_iter().map(|r| r.0).collect::<Vec<_>>(),
        vec!["swelake-samples/calc#7".to_string(), "swelake-samples/textkit#4".to_string()]
    );
}

#[test]
fn encoder_embeds_like_a_sentence_encoder() {
    let enc = swelake::relevance::encoder::Encoder::load(2).unwrap();
    let v = enc
        .embed(&["divide by zero raises an error", "ZeroDivisionError when dividing", "the cat sat on the mat"])
        .unwrap();
    for x in &v {
        assert_eq!(x.len(), 384);
        assert!((x.iter().map(|a| a * a).sum::<f32>() - 1.0).abs() < 1e-4);
    }
    let cos = swelake::relevance::encoder::cosine;
    assert!(cos(&v[0], &v[1]) > cos(&v[0], &v[2]) + 0.2, "{} vs {}", cos(&v[0], &v[1]), cos(&v[0], &v[2]));
    // Batching does not change a text's embedding.
    let alone = enc.embed(&["the cat sat on the mat"]).unwrap();
    assert!(cos(&alone[0], &v[2]) > 0.9999);
    let _ = Arc::new(0);
}

#[tokio::test(flavor = "multi_thread")]
async fn relevance_evaluation_on_the_sample_history() {
    let dir = tempfile::tempdir().unwrap();
    let (lake, _) = sample_lake(dir.path(), None).await;
    let repo = swelake::git::open_mirror(&dir.path().join("mirrors"), "swelake-samples/calc", "unused").unwrap();
    let changes = swelake::relevance::changes_from_lake(&lake, "swelake-samples/calc").await.unwrap();
    let config = swelake::jobs::CurationConfig::load(None).unwrap();
    let report = swelake::relevance::evaluate(&repo, &changes, &config.relevance, None, None).unwrap();
    assert!(report.cases >= 2, "{report:?}");
    let bm25 = report.recall["bm25 (text + paths)"];
    assert!(bm25[2] >= bm25[1] && bm25[1] >= bm25[0], "recall grows with k: {bm25:?}");
}
