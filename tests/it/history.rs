//! Real repository histories (`../shared/history`: pallets/jinja and pallets/werkzeug as git
//! bundles, with GH Archive-shaped events of their merged PRs and git's own answer per PR):
//! the PR tables and snapshots on hundreds of real merges. Skipped, saying so, on a checkout
//! without the histories.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::Path;

use serde::Deserialize;
use swelake::git::Mirrors;
use swelake::jobs::{run, GitOptions, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::quiet_ingest;

#[derive(Deserialize)]
struct Expected {
    merge_base: String,
    head: String,
    files: Vec<ExpectedFile>,
}

#[derive(Deserialize)]
struct ExpectedFile {
    status: String,
    path: String,
    old_path: Option<String>,
}

/// The hour files of `events` as one file (the events are the same; one commit instead of
/// hundreds keeps the test quick). Returns the PR numbers that several merges carry (the
/// history's first PRs reuse numbers of an older tracker): which of them a PR table keeps says
/// nothing about snapshots, so they are left out of the comparison.
pub(crate) fn concatenated(events: &Path, out: &Path) -> BTreeSet<i64> {
    let mut merges: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    let mut names: Vec<_> = std::fs::read_dir(events).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let r = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(std::fs::File::open(&p).unwrap()));
        for line in r.lines() {
            let line = line.unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let pr = &v["payload"]["pull_request"];
            if let (Some(n), Some(sha)) = (pr["number"].as_i64(), pr["merge_commit_sha"].as_str()) {
                merges.entry(n).or_default().insert(sha.to_string());
            }
            writeln!(w, "{line}").unwrap();
        }
    }
    merges.into_iter().filter(|(_, m)| m.len() > 1).map(|(n, _)| n).collect()
}

/// A changed file as (status letter, path, old path).
type Change = (String, String, Option<String>);

#[derive(Deserialize)]
struct Snapshot {
    pr_number: i64,
    merge_base: Option<String>,
    head_sha: String,
    status: String,
}

#[derive(Deserialize)]
struct File {
    pr_number: i64,
    path: String,
    old_path: Option<String>,
    status: String,
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_real_merges_agree_with_git() {
    let Some(history) = crate::common::history() else { return };
    for name in ["pallets/jinja", "pallets/werkzeug"] {
        let stem = name.replace('/', "-");
        let dir = tempfile::tempdir().unwrap();
        crate::common::mirror_of_bundle(&history, name, dir.path());
        let hour = dir.path().join("2011-04-25-18.json");
        let reused = concatenated(&history.join(&stem).join("events"), &hour);
        let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
        swelake::ingest::run(&lake, &quiet_ingest(&hour)).await.unwrap();
        let registry = Registry::load(None, None).unwrap();
        let mirrors =
            Mirrors::new(format!("{}/{{repo}}.git", dir.path().join("src").display()), dir.path().join("cache"));
        let opts = RunOptions { git: Some(GitOptions::new(mirrors)), ..Default::default() };
        run(&lake, &registry, &["snapshots".to_string()], &opts).await.unwrap();

        let expected: BTreeMap<String, Expected> =
            serde_json::from_str(&std::fs::read_to_string(history.join(&stem).join("expected.json")).unwrap()).unwrap();
        let ctx = lake.session().await.unwrap();
        let q = |table: &str, cols: &str| format!("SELECT {cols} FROM {table} WHERE repo_name = '{name}'");
        let snaps: Vec<Snapshot> =
            swelake::query::rows(&ctx, &q("pr_snapshots", "pr_number, merge_base, head_sha, status")).await.unwrap();
        let files: Vec<File> =
            swelake::query::rows(&ctx, &q("pr_files", "pr_number, path, old_path, status")).await.unwrap();
        let key = |n: i64| format!("{name}#{n}");
        assert_eq!(snaps.len(), expected.len(), "{name}: every merged PR is snapshotted");
        for s in snaps.iter().filter(|s| !reused.contains(&s.pr_number)) {
            let e = &expected[&key(s.pr_number)];
            assert_eq!(s.status, "ok", "{name}#{}", s.pr_number);
            assert_eq!(s.merge_base.as_deref(), Some(e.merge_base.as_str()), "{name}#{} merge base", s.pr_number);
            assert_eq!(s.head_sha, e.head, "{name}#{} head", s.pr_number);
        }
        // The paths each PR touched are git's (a rename names its old path too), and so are the
        // status letters: git's own rename decisions, heavily edited moves included.
        let mut ours: BTreeMap<String, (BTreeSet<String>, BTreeSet<Change>)> = BTreeMap::new();
        for f in files {
            let e = ours.entry(key(f.pr_number)).or_default();
            e.0.insert(f.path.clone());
            e.0.extend(f.old_path.clone());
            e.1.insert((f.status, f.path, f.old_path));
        }
        let mut same_status = 0;
        // A number several merges carry is compared where the PR table chose the same merge.
        let heads: BTreeMap<String, &str> = snaps.iter().map(|s| (key(s.pr_number), s.head_sha.as_str())).collect();
        let compared: Vec<(&String, &Expected)> = expected
            .iter()
            .filter(|(k, e)| !reused.iter().any(|n| **k == key(*n)) || heads.get(*k) == Some(&e.head.as_str()))
            .collect();
        for &(k, e) in &compared {
            let paths: BTreeSet<String> =
                e.files.iter().flat_map(|f| std::iter::once(f.path.clone()).chain(f.old_path.clone())).collect();
            let got = ours.remove(k).unwrap_or_default();
            assert_eq!(got.0, paths, "{k}: changed paths");
            let statuses: BTreeSet<Change> =
                e.files.iter().map(|f| (f.status[..1].to_string(), f.path.clone(), f.old_path.clone())).collect();
            same_status += usize::from(got.1 == statuses);
        }
        eprintln!(
            "{name}: {} of {} PRs compared ({} numbers reused by several merges), {same_status} with git's exact statuses",
            compared.len(),
            expected.len(),
            reused.len()
        );
        assert!(compared.len() + reused.len() >= expected.len() && compared.len() > 400);
        assert_eq!(same_status, compared.len(), "{name}: PRs whose statuses are git's");
    }
}

#[derive(Deserialize)]
struct SeedFile {
    instance_id: String,
    patch: String,
    old_mode: i64,
    is_binary: bool,
}

/// A harness's view of one exported SWE-bench instance.
#[derive(Deserialize)]
struct HarnessInstance {
    instance_id: String,
    base_commit: String,
    patch: String,
    test_patch: String,
}

/// `git apply --check` of `patch` at `commit` of a bare `mirror` (through a scratch index, so
/// no work tree is needed): the error text, or `None` when it applies.
fn apply_check(mirror: &Path, commit: &str, patch: &str, scratch: &Path) -> Option<String> {
    let index = scratch.join("index");
    let _ = std::fs::remove_file(&index);
    let git = |args: &[&str]| {
        let mut c = std::process::Command::new("git");
        c.arg("--git-dir").arg(mirror).args(args).env("GIT_INDEX_FILE", &index);
        c
    };
    assert!(git(&["read-tree", commit]).status().unwrap().success(), "read-tree {commit}");
    let file = scratch.join("change.patch");
    std::fs::write(&file, patch).unwrap();
    let out = git(&["apply", "--check", "--cached", file.to_str().unwrap()]).output().unwrap();
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A real history's seed in the trainers' tools: every shard loads in Hugging Face `datasets`;
/// every SWE-bench instance loads with SWE-bench's loader and its `patch` and `test_patch`
/// apply at its `base_commit` in the mirror.
async fn trainers_tools_open_a_real_history(lake: &Lake, mirror: &Path, dir: &Path, instances: usize) {
    let Some(py) = crate::python::python() else { return };
    let shards = lake.local_root().unwrap().join("shards/seed/*.parquet");
    let loaded: serde_json::Value =
        serde_json::from_str(crate::python::script(&py, "load_shards.py", &[shards.to_str().unwrap()], &[]).trim())
            .unwrap();
    assert_eq!(loaded["rows"], instances as i64);

    let out = dir.join("export-swebench");
    let opts = swelake::export::ExportOptions {
        format: swelake::export::ExportFormat::Swebench,
        out: out.to_str().unwrap().to_string(),
        storage_options: vec![],
        rows_per_file: 10_000,
        completeness: Default::default(),
        verified_only: false,
    };
    let s = swelake::export::run(lake, &opts).await.unwrap();
    let files = [out.join("train.jsonl"), out.join("test.jsonl")];
    let files: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let text = crate::python::script(&py, "load_swebench.py", &files, &[]);
    let loaded: Vec<HarnessInstance> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(loaded.len() + s.only_tests, instances, "{s:?}");
    assert!(loaded.len() * 10 >= instances * 8, "{} of {instances} exported", loaded.len());
    let scratch = tempfile::tempdir().unwrap();
    let (mut with_tests, mut failures) = (0, Vec::new());
    for i in &loaded {
        for (what, patch) in [("patch", &i.patch), ("test_patch", &i.test_patch)] {
            if patch.is_empty() {
                continue;
            }
            if let Some(e) = apply_check(mirror, &i.base_commit, patch, scratch.path()) {
                failures.push(format!("{} {what}: {e}", i.instance_id));
            }
        }
        with_tests += usize::from(!i.test_patch.is_empty());
    }
    eprintln!(
        "swebench export: {} instances ({with_tests} with a test patch, {} left out as tests only); all apply at base_commit",
        loaded.len(),
        s.only_tests
    );
    assert!(failures.is_empty(), "{} of {} do not apply:\n{}", failures.len(), loaded.len(), failures.join("\n"));
    assert!(with_tests > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn seed_instances_of_a_real_history_show_every_hunk_and_their_oracles_score_one() {
    let Some(history) = crate::common::history() else { return };
    let (name, stem) = ("pallets/jinja", "pallets-jinja");
    let dir = tempfile::tempdir().unwrap();
    let mirror = crate::common::mirror_of_bundle(&history, name, dir.path());
    let hour = dir.path().join("2011-04-25-18.json");
    concatenated(&history.join(stem).join("events"), &hour);
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    swelake::ingest::run(&lake, &quiet_ingest(&hour)).await.unwrap();
    let registry = Registry::load(None, None).unwrap();
    let mirrors = Mirrors::new(format!("{}/{{repo}}.git", dir.path().join("src").display()), dir.path().join("cache"));
    let mut curation = swelake::jobs::CurationConfig::load(None).unwrap();
    // BM25 keeps CI quick; the prompts' budget is the default's.
    curation.relevance.ranker = swelake::relevance::rank::Ranker::Bm25;
    let opts = RunOptions { git: Some(GitOptions::new(mirrors)), all: true, curation, ..Default::default() };
    let wanted: Vec<String> = registry.jobs.keys().cloned().collect();
    run(&lake, &registry, &wanted, &opts).await.unwrap();

    let ctx = lake.session().await.unwrap();
    let kept = crate::common::count(&lake, "SELECT count(*) FROM pr_quality WHERE keep").await;
    let instances: Vec<(String, String, f64)> = swelake::query::rows(
        &ctx,
        "SELECT instance_id, prompt[2]['content'], extra_info['oracle_reward'] FROM rl_seed ORDER BY instance_id",
    )
    .await
    .unwrap();
    let segmented = crate::common::count(
        &lake,
        "SELECT count(*) FROM (SELECT instance_id FROM rl_seed WHERE array_has(map_values(prompt_context), 'segments'))",
    )
    .await;
    eprintln!("{name}: {} of {kept} kept PRs are instances ({segmented} with segmented files)", instances.len());
    assert!(instances.len() * 10 >= kept as usize * 9, "{} of {kept}", instances.len());
    // Every hunk's original lines (its context and removed lines, read from the patch here)
    // appear verbatim in the prompt; every oracle scores 1.0.
    let files: Vec<SeedFile> = swelake::query::rows(
        &ctx,
        "SELECT s.instance_id, f.patch, f.old_mode, f.is_binary FROM pr_files f \
         JOIN rl_seed s ON s.instance_id = concat(f.repo_name, '#', CAST(f.pr_number AS VARCHAR)) \
         WHERE f.status <> 'A'",
    )
    .await
    .unwrap();
    let prompts: BTreeMap<&str, &str> = instances.iter().map(|(i, p, _)| (i.as_str(), p.as_str())).collect();
    let mut hunks = 0;
    for f in files.iter().filter(|f| !f.is_binary && f.old_mode & 0o170000 == 0o100000) {
        let mut cur: Vec<&str> = Vec::new();
        let mut all = Vec::new();
        for l in f.patch.lines() {
            if l.starts_with("@@") {
                all.push(std::mem::take(&mut cur));
            } else if let Some(rest) = l.strip_prefix(' ').or_else(|| l.strip_prefix('-')) {
                if !l.starts_with("---") {
                    cur.push(rest);
                }
            }
        }
        all.push(cur);
        for h in all.into_iter().filter(|h| !h.is_empty()) {
            hunks += 1;
            assert!(
                prompts[f.instance_id.as_str()].contains(&h.join("\n")),
                "{}: a hunk is not in the prompt:\n{}",
                f.instance_id,
                h.join("\n")
            );
        }
    }
    assert!(hunks > instances.len(), "{hunks} hunks");
    for (id, _, reward) in &instances {
        assert_eq!(*reward, 1.0, "{id}: its oracle");
    }
    trainers_tools_open_a_real_history(&lake, &mirror, dir.path(), instances.len()).await;

    // Relevance on the same real history, leave-one-out over every merged PR: the learned
    // first stage (fitted as PRs go by, on earlier PRs only) above BM25 (the encoder's part is
    // measured by `swelake eval-relevance`; its cost does not fit CI).
    let repo = opts.git.as_ref().unwrap().scope.mirrors.open(name).unwrap();
    let changes = swelake::relevance::changes_from_lake(&lake, name).await.unwrap();
    let report = tokio::task::block_in_place(|| {
        swelake::relevance::evaluate(&repo, &changes, &opts.curation.relevance, None, None)
    })
    .unwrap();
    eprintln!("{name}: {}", report.render());
    let bm25 = report.recall["bm25 (text + paths)"];
    let learned = report.recall["learned, no encoder (text + paths)"];
    assert!(report.cases > 700, "{}", report.cases);
    assert!(learned[2] >= bm25[2] + 0.04, "recall@10 {learned:?} vs BM25 {bm25:?}");
    assert!(learned[0] >= bm25[0] + 0.05, "recall@1 {learned:?} vs BM25 {bm25:?}");
    assert!(report.learned["learned, no encoder (text + paths)"].fits >= 5);

    // The job's fit: on the most recent cases, away from the config's starting weights.
    let mut cfg = opts.curation.relevance.clone();
    cfg.ranker = swelake::relevance::rank::Ranker::Hybrid;
    let base = swelake::relevance::Pipeline::from_config(&cfg);
    let facts = swelake::relevance::rank::FactsCache::default();
    let (fitted, cases) = tokio::task::block_in_place(|| {
        swelake::relevance::fit_on_history(&repo, &changes, base.clone(), &cfg, &facts, None)
    })
    .unwrap();
    assert!(cases > 300 && cases <= cfg.train_cases, "{cases}");
    assert_eq!(fitted.cheap.fitted_on, cases);
    assert_ne!(fitted.cheap.weights, base.cheap.weights);
    assert!(fitted.describe(Some("enc")).contains(&format!("first stage learned on {cases} cases: bm25=")));

    // The relevance job fits on a budget of cases per PR it ranks (the cheap features only),
    // stores the fit and why in relevance_models, and a later run (here a --force re-rank)
    // ranks with it instead of fitting again, to the same rows bit for bit.
    cfg.encoder = false;
    let scope = swelake::git::Scope { force: true, ..opts.git.as_ref().unwrap().scope.clone() };
    let ro = swelake::relevance::RelevanceOptions { scope, config: cfg.clone() };
    let first = swelake::relevance::run(&lake, &ro).await.unwrap();
    // The budget bounds the cases; a case whose hidden file has no other candidate teaches
    // nothing and is not counted.
    let budget = cfg.train_cases.min(cfg.fit_cases_per_pr * first.prs);
    let fit_cases = first.training_cases;
    assert_eq!((first.fits_reused, first.fits), (0, 1), "{first:?}");
    assert!(fit_cases <= budget && fit_cases * 10 >= budget * 9, "{fit_cases} cases for a budget of {budget}");
    let ctx = lake.session().await.unwrap();
    let stored: Vec<(String, i64, i64, String)> =
        swelake::query::rows(&ctx, "SELECT repo_name, history_changes, training_cases, weights FROM relevance_models")
            .await
            .unwrap();
    assert_eq!(stored, vec![(name.to_string(), changes.len() as i64, fit_cases as i64, "fitted".to_string())]);
    let rows =
        "SELECT repo_name, pr_number, rank, path, blob_sha, score, model FROM pr_relevant_files ORDER BY 1, 2, 3";
    let ranked_first: Vec<(String, i64, i64, String, String, f64, String)> =
        swelake::query::rows(&ctx, rows).await.unwrap();
    let second = swelake::relevance::run(&lake, &ro).await.unwrap();
    assert_eq!((second.fits_reused, second.training_cases), (1, 0), "{second:?}");
    assert_eq!(second.prs, first.prs);
    let ctx = lake.session().await.unwrap();
    let ranked_second: Vec<(String, i64, i64, String, String, f64, String)> =
        swelake::query::rows(&ctx, rows).await.unwrap();
    let bits = |v: &[(String, i64, i64, String, String, f64, String)]| {
        v.iter().map(|r| (r.0.clone(), r.1, r.2, r.3.clone(), r.5.to_bits(), r.6.clone())).collect::<Vec<_>>()
    };
    assert_eq!(bits(&ranked_second), bits(&ranked_first));
    let models: Vec<(String, i64)> =
        swelake::query::rows(&ctx, "SELECT DISTINCT model, 1 FROM pr_relevant_files").await.unwrap();
    assert_eq!(models.len(), 1, "{models:?}");
    assert!(models[0].0.contains(&format!("[learned on {fit_cases} cases: bm25=")), "{models:?}");
}
