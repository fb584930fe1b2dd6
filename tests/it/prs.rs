use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};
use swelake::ingest::run as ingest;
use swelake::jobs::{run, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::{count, gharchive, pairs, quiet_ingest, read_lines};

type Pr = (String, i64);

/// PRs and merged PRs counted straight from raw lines with serde_json, independently of swelake:
/// a PR is any (repo, number) of a pull-request event or of an issue event whose issue is a
/// PR; it is merged when a payload says so (closed + merged, the `merged` action, or an issue
/// object's pull_request.merged_at).
fn independent(lines: &[String]) -> (BTreeSet<Pr>, BTreeSet<Pr>) {
    let (all, merged, _) = independent_with_flags(lines);
    (all, merged)
}

/// Also the PRs some payload gives an explicit `pull_request.merged` boolean for.
fn independent_with_flags(lines: &[String]) -> (BTreeSet<Pr>, BTreeSet<Pr>, BTreeSet<Pr>) {
    let (mut all, mut merged, mut flagged) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let repo = v["repo"]["name"].as_str().unwrap().to_string();
        let p = &v["payload"];
        match v["type"].as_str().unwrap() {
            t if t.starts_with("PullRequest") => {
                let n = p["number"].as_i64().or(p["pull_request"]["number"].as_i64()).unwrap();
                all.insert((repo.clone(), n));
                if p["pull_request"]["merged"].is_boolean() {
                    flagged.insert((repo.clone(), n));
                }
                if (p["action"] == "closed" && p["pull_request"]["merged"] == true) || p["action"] == "merged" {
                    merged.insert((repo, n));
                }
            }
            "IssueCommentEvent" | "IssuesEvent" if p["issue"]["pull_request"].is_object() => {
                let n = p["issue"]["number"].as_i64().unwrap();
                all.insert((repo.clone(), n));
                if !p["issue"]["pull_request"]["merged_at"].is_null() {
                    merged.insert((repo, n));
                }
            }
            _ => {}
        }
    }
    (all, merged, flagged)
}

async fn run_all(lake: &Lake) -> Vec<swelake::jobs::JobSummary> {
    let registry = Registry::load(None, None).unwrap();
    let all: Vec<String> = registry.jobs.keys().cloned().collect();
    run(lake, &registry, &all, &RunOptions { all: true, ..Default::default() }).await.unwrap()
}

async fn pr_set(lake: &Lake, filter: &str) -> BTreeSet<Pr> {
    pairs(lake, &format!("SELECT repo_name, number FROM pull_requests WHERE {filter}")).await.into_iter().collect()
}

/// A content hash of a whole table: its rows as JSON lines, sorted.
async fn table_hash(lake: &Lake, table: &str) -> (usize, u64) {
    use std::hash::{Hash, Hasher};
    let batches = swelake::sql::query(lake, &format!("SELECT * FROM {table}")).await.unwrap();
    let mut buf = Vec::new();
    swelake::sql::write(&batches, swelake::sql::Format::Jsonl, &mut buf).unwrap();
    let mut rows: Vec<&str> = std::str::from_utf8(&buf).unwrap().lines().collect();
    rows.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rows.hash(&mut h);
    (rows.len(), h.finish())
}

const TABLES: [&str; 4] = ["pr_timeline", "pull_requests", "issues", "pr_issue_links"];

#[tokio::test(flavor = "multi_thread")]
async fn real_excerpts_prs_and_merges_match_raw_counts_and_jobs_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut want_all = BTreeSet::new();
    let mut want_merged = BTreeSet::new();
    let mut want_flagged = BTreeSet::new();
    for name in ["2015-01-01-15.json.gz", "2025-01-01-15.json.gz"] {
        std::fs::copy(gharchive(name), src.join(name)).unwrap();
        let (all, merged, flagged) = independent_with_flags(&read_lines(&gharchive(name)));
        assert!(merged.len() > 10 && all.len() > merged.len(), "{name}: {} PRs, {} merged", all.len(), merged.len());
        want_all.extend(all);
        want_merged.extend(merged);
        want_flagged.extend(flagged);
    }
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    ingest(&lake, &quiet_ingest(&src)).await.unwrap();
    let first = run_all(&lake).await;
    let pr_jobs = |s: &swelake::jobs::JobSummary| TABLES.contains(&s.job.as_str());
    assert!(first.iter().filter(|s| pr_jobs(s)).all(|s| s.partitions.len() == 2), "{first:?}");

    assert_eq!(pr_set(&lake, "true").await, want_all);
    assert_eq!(pr_set(&lake, "merged").await, want_merged);
    // Unknown exactly where no payload gives a merge flag and nothing shows a merge: PRs
    // seen only through comments on their issue objects.
    let want_unknown: BTreeSet<Pr> =
        want_all.iter().filter(|p| !want_merged.contains(*p) && !want_flagged.contains(*p)).cloned().collect();
    assert_eq!(pr_set(&lake, "merged IS NULL").await, want_unknown);
    assert!(want_unknown.len() < want_all.len() / 2);
    assert_eq!(count(&lake, "SELECT count(*) FROM pull_requests WHERE merged AND merged_at IS NULL").await, 0);
    // The tables agree with their schema files.
    crate::common::assert_tables_match_schemas(&lake, &TABLES).await;

    // Running every job again changes nothing: nothing to do, same content.
    let mut before = BTreeMap::new();
    for t in TABLES {
        before.insert(t, table_hash(&lake, t).await);
    }
    let second = run_all(&lake).await;
    assert!(second.iter().all(|s| s.partitions.is_empty()), "{second:?}");
    for t in TABLES {
        assert_eq!(table_hash(&lake, t).await, before[t], "{t} after a no-op run");
    }
    // Re-ingesting an hour changes the input files of its date: the jobs redo that date and
    // end with the same content.
    let mut again = quiet_ingest(&src.join("2025-01-01-15.json.gz"));
    again.force = true;
    ingest(&lake, &again).await.unwrap();
    let third = run_all(&lake).await;
    let timeline = third.iter().find(|s| s.job == "pr_timeline").unwrap();
    assert_eq!(timeline.partitions, vec!["2025-01-01".to_string()]);
    for t in TABLES {
        assert_eq!(table_hash(&lake, t).await, before[t], "{t} after reprocessing a date");
    }
}

/// Cuts a real event down to the payload shape of GitHub's 2025-10-07 trim and
/// moves it into the trimmed era.
fn trim(v: Value) -> Value {
    let mut v = crate::common::trim_payload(v);
    let ts = v["created_at"].as_str().unwrap().replace("2025-01-01", "2025-11-01");
    v["created_at"] = json!(ts);
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn trimmed_era_recovers_titles_from_issue_objects_and_leaves_merges_unknown() {
    let lines = read_lines(&gharchive("2025-01-01-15.json.gz"));
    let originals: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (want_all, _) = independent(&lines);

    // Latest original title of every PR, from the full payloads.
    let mut title: BTreeMap<Pr, String> = BTreeMap::new();
    for v in &originals {
        if v["type"].as_str().unwrap().starts_with("PullRequest") {
            let key = (
                v["repo"]["name"].as_str().unwrap().to_string(),
                v["payload"]["pull_request"]["number"].as_i64().unwrap(),
            );
            if let Some(t) = v["payload"]["pull_request"]["title"].as_str() {
                title.insert(key, t.to_string());
            }
        }
    }
    let mut out: Vec<Value> = originals.iter().cloned().map(trim).collect();
    // Issue-comment events for every other originally merged PR, as GitHub still sends them:
    // the complete issue object of the PR, with pull_request.merged_at.
    let merged_by_pr_event: BTreeSet<Pr> = originals
        .iter()
        .filter(|v| {
            v["type"] == "PullRequestEvent"
                && v["payload"]["action"] == "closed"
                && v["payload"]["pull_request"]["merged"] == true
        })
        .map(|v| (v["repo"]["name"].as_str().unwrap().to_string(), v["payload"]["number"].as_i64().unwrap()))
        .collect();
    let chosen: BTreeSet<Pr> = merged_by_pr_event.iter().step_by(2).cloned().collect();
    assert!(chosen.len() >= 10);
    for (i, (repo, n)) in chosen.iter().enumerate() {
        let pr = originals
            .iter()
            .rfind(|v| {
                v["type"] == "PullRequestEvent" && v["repo"]["name"] == repo.as_str() && v["payload"]["number"] == *n
            })
            .unwrap();
        let p = &pr["payload"]["pull_request"];
        out.push(json!({
            "id": format!("77000000{i:03}"), "type": "IssueCommentEvent",
            "actor": {"id": 1, "login": "reviewer"}, "repo": pr["repo"], "public": true,
            "created_at": "2025-11-01T15:59:00Z",
            "payload": {"action": "created",
                "issue": {"number": n, "title": p["title"], "body": p["body"], "user": p["user"], "state": "closed",
                          "labels": [], "pull_request": {"url": p["url"], "merged_at": p["merged_at"]}},
                "comment": {"id": 1000 + i, "body": "thanks!", "user": {"login": "reviewer", "type": "User"}}}
        }));
    }
    // What swelake should conclude, computed from the trimmed lines themselves.
    let trimmed_lines: Vec<String> = out.iter().map(|v| v.to_string()).collect();
    let (trimmed_all, trimmed_merged) = independent(&trimmed_lines);
    assert_eq!(trimmed_all, want_all, "stubs keep every PR");
    assert!(chosen.is_subset(&trimmed_merged));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("2025-11-01-15.json.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for l in &trimmed_lines {
        writeln!(gz, "{l}").unwrap();
    }
    std::fs::write(&file, gz.finish().unwrap()).unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let s = ingest(&lake, &quiet_ingest(&file)).await.unwrap();
    assert_eq!(s.rejected, 0);
    let summaries = run_all(&lake).await;

    assert_eq!(pr_set(&lake, "true").await, want_all);
    assert_eq!(pr_set(&lake, "merged").await, trimmed_merged);
    // No payload says "not merged" any more: every other PR's merge state is unknown.
    let unknown = pr_set(&lake, "merged IS NULL").await;
    assert_eq!(unknown, want_all.difference(&trimmed_merged).cloned().collect());
    assert_eq!(pr_set(&lake, "merged = false").await, BTreeSet::new());
    let report = summaries.iter().find(|s| s.job == "pull_requests").unwrap();
    assert_eq!(report.notes["unknown_merge_state"], unknown.len() as i64);

    // Titles recovered from the issue objects, and said so.
    for pr in &chosen {
        let row = pairs(
            &lake,
            &format!("SELECT title, CAST(metadata_source = 'issue_event' AS INT) FROM pull_requests WHERE repo_name = '{}' AND number = {}", pr.0, pr.1),
        )
        .await;
        assert_eq!(row, vec![(title[pr].clone(), 1)], "{pr:?}");
    }
    // PRs with no issue object at all have no title, and say so.
    let no_issue =
        count(&lake, "SELECT count(*) FROM pull_requests WHERE metadata_source = 'none' AND title IS NULL").await;
    assert_eq!(no_issue, count(&lake, "SELECT count(*) FROM pull_requests WHERE metadata_source = 'none'").await);
    assert!(no_issue > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn analyst_examples_run_and_links_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    ingest(&lake, &quiet_ingest(&samples)).await.unwrap();
    ingest(&lake, &quiet_ingest(&gharchive("2025-01-01-15.json.gz"))).await.unwrap();
    run_all(&lake).await;

    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/examples");
    let mut ran = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        let sql = std::fs::read_to_string(&path).unwrap();
        let batches = swelake::sql::query(&lake, &sql).await.unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        assert!(batches.iter().map(|b| b.num_rows()).sum::<usize>() > 0, "{} returned nothing", path.display());
        ran += 1;
    }
    assert!(ran >= 5);
    let merged_per_day = count(
        &lake,
        &format!(
            "SELECT sum(merged_prs) FROM ({})",
            std::fs::read_to_string(examples.join("merged_prs_per_repo_per_day.sql"))
                .unwrap()
                .trim_end()
                .trim_end_matches(';')
        ),
    )
    .await;
    assert_eq!(merged_per_day, count(&lake, "SELECT count(*) FROM pull_requests WHERE merged").await);

    // The sample PR says "Fixes #1." in its body and "resolves #1" in a pushed commit.
    let links = pairs(
        &lake,
        "SELECT concat(repo_name, '#', CAST(pr_number AS VARCHAR), '->', CAST(issue_number AS VARCHAR), ' ', keyword, ' ', source), mentions \
         FROM pr_issue_links WHERE repo_name = 'swelake-samples/calc' ORDER BY pr_number",
    )
    .await;
    assert_eq!(
        links,
        vec![
            ("swelake-samples/calc#2->1 fixes body".to_string(), 2),
            ("swelake-samples/calc#7->6 fixes body".to_string(), 1)
        ]
    );
}
