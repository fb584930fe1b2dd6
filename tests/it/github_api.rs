//! `swelake ingest --github` against a local server (github_mock.rs) that behaves as GitHub's REST API does —
//! `Link` pagination, `per_page`, `since`, ETags and 304s, rate-limit headers, one secondary
//! limit (403 with `retry-after`), one 502, 401 without the token — serving real REST objects:
//! the pull_request, issue and comment objects of five repositories of GH Archive's
//! 2025-01-01-15 hour (tests/data/github; the pulls list's objects as GitHub's "simple" ones,
//! without `merged`, `additions`, `commits` …). The same hour's archive lines give the other lake.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use swelake::lake::Lake;

use crate::github_mock::{data_dir, excerpt_objects, serve_api, swelake, TOKEN};

#[derive(Deserialize, Debug, PartialEq, Clone)]
struct Pr {
    repo_name: String,
    number: i64,
    title: Option<String>,
    body: Option<String>,
    state: Option<String>,
    merged: Option<bool>,
    merge_commit_sha: Option<String>,
}

#[derive(Deserialize, Debug, PartialEq, Clone)]
struct Issue {
    repo_name: String,
    number: i64,
    title: Option<String>,
    body: Option<String>,
    state: Option<String>,
}

async fn prs(lake: &Lake) -> Vec<Pr> {
    let ctx = lake.session().await.unwrap();
    swelake::query::rows(
        &ctx,
        "SELECT repo_name, number, title, body, state, merged, merge_commit_sha FROM pull_requests \
         ORDER BY repo_name, number",
    )
    .await
    .unwrap()
}

async fn issues(lake: &Lake) -> Vec<Issue> {
    let ctx = lake.session().await.unwrap();
    swelake::query::rows(&ctx, "SELECT repo_name, number, title, body, state FROM issues ORDER BY repo_name, number")
        .await
        .unwrap()
}

/// Every file under `dir` as bytes, for a search.
fn contains_bytes(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for e in walk(dir) {
        if let Ok(b) = std::fs::read(&e) {
            if b.windows(needle.len()).any(|w| w == needle) {
                hits.push(e.display().to_string());
            }
        }
    }
    hits
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rest_api_gives_the_archives_rows_politely_and_incrementally() {
    let data = excerpt_objects();
    // A page of at most 2 items, so that the five repositories' lists take several pages.
    let (base, mock) = serve_api(
        data.clone(),
        vec![
            ("/repos/nilcsi/topic-interview-questions/issues/comments".into(), 403),
            ("/repos/nilcsi/topic-interview-questions/pulls?direction=desc&page=2".into(), 502),
        ],
        2,
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos.txt");
    let names: Vec<&String> = data.as_object().unwrap().keys().collect();
    std::fs::write(
        &repos,
        format!(
            "# the excerpt's repositories\n{}\ngone/missing\n",
            names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        ),
    )
    .unwrap();
    let api_lake = dir.path().join("api");
    let (a, r) = (api_lake.to_str().unwrap(), repos.to_str().unwrap());
    let ingest = ["ingest", "--github", "--repos-file", r, "--lake", a, "--api-url", &base, "-vv"];

    // Without the token: GitHub's 401, said without a token in it; nothing written.
    let (ok, out) = swelake(&ingest, &[]);
    assert!(!ok && out.contains("401") && out.contains("$GITHUB_TOKEN"), "{out}");

    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    assert!(!out.contains(TOKEN), "the token appears in the output:\n{out}");
    let first_run: Vec<(String, u16)> = std::mem::take(&mut mock.lock().unwrap().log);
    // The secondary limit was waited out and the 502 retried; pages followed `Link`.
    assert!(first_run.iter().any(|(_, s)| *s == 403) && first_run.iter().any(|(_, s)| *s == 502), "{first_run:?}");
    assert!(first_run.iter().any(|(p, s)| p.contains("page=2") && *s == 200), "{first_run:?}");
    assert!(first_run.iter().all(|(p, _)| !p.contains("page=") || p.contains("per_page=100")), "{first_run:?}");

    let lake = Lake::open(a).unwrap();
    let (ok, out) = swelake(&["run", "pull_requests", "issues", "--lake", a], &[]);
    assert!(ok, "{out}");

    // The rows equal the objects served.
    let got = prs(&lake).await;
    let mut served: Vec<Pr> = Vec::new();
    for (name, r) in data.as_object().unwrap() {
        for p in r["pulls"].as_array().unwrap() {
            served.push(Pr {
                repo_name: name.clone(),
                number: p["number"].as_i64().unwrap(),
                title: p["title"].as_str().map(str::to_string),
                body: p["body"].as_str().map(str::to_string),
                state: p["state"].as_str().map(str::to_string),
                merged: Some(!p["merged_at"].is_null()),
                merge_commit_sha: p["merge_commit_sha"].as_str().map(str::to_string),
            });
        }
    }
    served.sort_by(|x, y| (&x.repo_name, x.number).cmp(&(&y.repo_name, y.number)));
    // An open PR's merge state is not known (never a guessed false).
    let got_norm: Vec<Pr> = got
        .iter()
        .cloned()
        .map(|mut p| {
            if p.state.as_deref() == Some("open") {
                p.merged = Some(false);
            }
            p
        })
        .collect();
    assert_eq!(got_norm, served);
    let ctx = lake.session().await.unwrap();
    let sources: Vec<(String,)> =
        swelake::query::rows(&ctx, "SELECT DISTINCT metadata_source FROM pull_requests").await.unwrap();
    assert_eq!(sources, [("github_api".to_string(),)]);
    let event_sources: Vec<(Option<String>,)> =
        swelake::query::rows(&ctx, "SELECT DISTINCT source FROM events").await.unwrap();
    assert_eq!(event_sources, [(Some("github_api".to_string()),)]);

    // Next to the archive's lake of the same hour: the same PRs and issues.
    let archive_lake = dir.path().join("archive");
    let b = archive_lake.to_str().unwrap();
    let hour = data_dir().join("2025-01-01-15.json");
    let (ok, out) = swelake(&["ingest", "--source", hour.to_str().unwrap(), "--lake", b], &[]);
    assert!(ok, "{out}");
    let (ok, out) = swelake(&["run", "pull_requests", "issues", "--lake", b], &[]);
    assert!(ok, "{out}");
    let archive = Lake::open(b).unwrap();
    assert_eq!(got, prs(&archive).await);
    let api_issues = issues(&lake).await;
    assert!(!api_issues.is_empty());
    assert_eq!(api_issues, issues(&archive).await);

    // Per repository: what was read, the watermark; the missing one is a row, not a failure.
    #[derive(Deserialize, Debug)]
    struct St {
        repo_name: String,
        status: String,
        watermark: String,
        prs_last_run: i64,
        comments_last_run: i64,
    }
    let st: Vec<St> = swelake::query::rows(
        &ctx,
        "SELECT repo_name, status, watermark, prs_last_run, comments_last_run FROM github_api_repos ORDER BY repo_name",
    )
    .await
    .unwrap();
    assert_eq!(st.len(), 6, "{st:?}");
    let missing = st.iter().find(|s| s.repo_name == "gone/missing").unwrap();
    assert_eq!(missing.status, "not_found");
    let nilcsi = st.iter().find(|s| s.repo_name == "nilcsi/topic-interview-questions").unwrap();
    assert_eq!((nilcsi.status.as_str(), nilcsi.prs_last_run, nilcsi.comments_last_run), ("ok", 6, 3));
    assert!(nilcsi.watermark.starts_with("2025-01-01T15:"), "{nilcsi:?}");

    // A rerun: every call answers 304 (no quota) or asks `since` the watermark; nothing changes.
    let events_before = crate::common::count(&lake, "SELECT count(*) FROM events").await;
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok && !out.contains(TOKEN), "{out}");
    let rerun: Vec<(String, u16)> = std::mem::take(&mut mock.lock().unwrap().log);
    let data_calls: Vec<&(String, u16)> =
        rerun.iter().filter(|(p, s)| *s == 200 && !p.starts_with("/repos/gone/")).collect();
    assert!(data_calls.iter().all(|(p, _)| p.contains("since=")), "data served again: {data_calls:?}");
    assert!(rerun.iter().filter(|(_, s)| *s == 304).count() >= 10, "{rerun:?}");
    assert_eq!(crate::common::count(&lake, "SELECT count(*) FROM events").await, events_before);

    // An issue edited later: the next run reads it (and only what changed), replaces its
    // events, and keeps every other object's.
    let (issue_number, edited) = {
        let mut m = mock.lock().unwrap();
        let issue = m.data["Abhay-hack/Lumina"]["issues"][0].as_object_mut().unwrap();
        issue.insert("body".into(), Value::String("Edited: the steps to reproduce, in full.".into()));
        issue.insert("updated_at".into(), Value::String("2025-01-02T09:00:00Z".into()));
        let edited = (issue["number"].as_i64().unwrap(), issue["body"].as_str().unwrap().to_string());
        // An organization's repository whose own object did not change (304): its new events
        // still carry the organization.
        let issue = m.data["rapid7/metasploit-framework"]["issues"][0].as_object_mut().unwrap();
        issue.insert("updated_at".into(), Value::String("2025-01-02T09:30:00Z".into()));
        edited
    };
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    let (ok, out) = swelake(&["run", "issues", "--lake", a], &[]);
    assert!(ok, "{out}");
    let after = issues(&lake).await;
    let lumina = after.iter().find(|i| i.repo_name == "Abhay-hack/Lumina" && i.number == issue_number).unwrap();
    assert_eq!(lumina.body.as_deref(), Some(edited.as_str()));
    assert_eq!(after.len(), api_issues.len());
    assert!(
        mock.lock().unwrap().log.iter().any(|(p, s)| p == "/repos/rapid7/metasploit-framework" && *s == 304),
        "the repository's object answers 304"
    );
    let orgs: Vec<(Option<String>,)> = swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT DISTINCT org_login FROM events WHERE repo_name = 'rapid7/metasploit-framework'",
    )
    .await
    .unwrap();
    assert_eq!(orgs, [(Some("rapid7".to_string()),)]);
    // The one new event: rapid7's issue now has an `edited` one (updated after it was opened).
    assert_eq!(crate::common::count(&lake, "SELECT count(*) FROM events").await, events_before + 1);
    assert_eq!(prs(&lake).await, got);

    // The token is in no file of the lake.
    assert!(contains_bytes(&api_lake, TOKEN.as_bytes()).is_empty());
}

#[derive(Deserialize, Debug)]
struct Text {
    repo_name: String,
    number: i64,
    body: Option<String>,
    metadata_source: String,
}

async fn pr_texts(lake: &Lake) -> Vec<Text> {
    swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT repo_name, number, body, metadata_source FROM pull_requests ORDER BY repo_name, number",
    )
    .await
    .unwrap()
}

/// Each served PR's body, by (repository, number).
fn served_bodies(data: &Value) -> BTreeMap<(String, i64), Option<String>> {
    let mut out = BTreeMap::new();
    for (name, r) in data.as_object().unwrap() {
        for p in r["pulls"].as_array().unwrap() {
            out.insert((name.clone(), p["number"].as_i64().unwrap()), p["body"].as_str().map(str::to_string));
        }
    }
    out
}

/// The same hour cut to the payload shape of GitHub's 2025-10-07 trim (PR events are stubs:
/// no title, body, merge flag or user; DESIGN.md §3), as every hour since is: the API gives
/// the PRs' text back, and `metadata_source` says so. At GitHub's page size each of these
/// repositories costs one call for itself and one per list.
#[tokio::test(flavor = "multi_thread")]
async fn a_trimmed_hour_gets_its_pr_text_back_through_the_api() {
    let data = excerpt_objects();
    let (base, mock) = serve_api(data.clone(), vec![], 100).await;
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read_to_string(data_dir().join("2025-01-01-15.json")).unwrap();
    let trimmed: String =
        full.lines().map(|l| format!("{}\n", crate::common::trim_payload(serde_json::from_str(l).unwrap()))).collect();
    let hour = dir.path().join("2025-01-01-15.json");
    std::fs::write(&hour, trimmed).unwrap();
    let lake_dir = dir.path().join("lake");
    let a = lake_dir.to_str().unwrap();
    let (ok, out) = swelake(&["ingest", "--source", hour.to_str().unwrap(), "--lake", a], &[]);
    assert!(ok, "{out}");
    let (ok, out) = swelake(&["run", "pull_requests", "issues", "--lake", a], &[]);
    assert!(ok, "{out}");
    let lake = Lake::open(a).unwrap();
    let served = served_bodies(&data);
    let before = pr_texts(&lake).await;
    let lost: Vec<&Text> = before
        .iter()
        .filter(|t| t.body.is_none() && served.get(&(t.repo_name.clone(), t.number)).is_some_and(Option::is_some))
        .collect();
    assert!(lost.len() >= 3, "the trim takes PR bodies away: {before:?}");
    assert_eq!(
        crate::common::count(&lake, "SELECT count(*) FROM pull_requests WHERE NOT saw_trimmed_payload").await,
        0
    );

    let repos = dir.path().join("repos.txt");
    let names: Vec<String> = data.as_object().unwrap().keys().cloned().collect();
    std::fs::write(&repos, names.join("\n")).unwrap();
    let ingest = ["ingest", "--github", "--repos-file", repos.to_str().unwrap(), "--lake", a, "--api-url", &base];
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    // One call for the repository and one per list, each list under 100 objects.
    let log = std::mem::take(&mut mock.lock().unwrap().log);
    for n in &names {
        let calls = log
            .iter()
            .filter(|(p, _)| p.starts_with(&format!("/repos/{n}")) && !p.contains(&format!("/repos/{n}-")))
            .count();
        assert_eq!(calls, 5, "{n}: {log:?}");
    }
    // The next scheduled runs, nothing changed: the same 5 calls each. The first of them asks
    // the three lists of comments and issues `since` the watermark for the first time (GitHub's `since`
    // includes the watermark's second: the newest objects come again, and give the new URLs
    // their ETags); from then on every call is a 304.
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    let second = std::mem::take(&mut mock.lock().unwrap().log);
    assert_eq!(second.len(), 5 * names.len(), "{second:?}");
    assert!(second.iter().all(|(p, s)| *s == 304 || p.contains("since=")), "{second:?}");
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    let third = std::mem::take(&mut mock.lock().unwrap().log);
    assert_eq!(third.len(), 5 * names.len(), "{third:?}");
    assert!(third.iter().all(|(_, s)| *s == 304), "{third:?}");
    eprintln!(
        "calls: first read {}, second run {} ({} answered 304), third {} (all 304)",
        log.len(),
        second.len(),
        second.iter().filter(|(_, s)| *s == 304).count(),
        third.len()
    );
    let (ok, out) = swelake(&["run", "pull_requests", "issues", "--lake", a], &[]);
    assert!(ok, "{out}");

    let after = pr_texts(&lake).await;
    assert_eq!(after.len(), before.len(), "one row per PR, whichever source holds it");
    for t in &after {
        let want = &served[&(t.repo_name.clone(), t.number)];
        assert_eq!(&t.body, want, "{}#{}", t.repo_name, t.number);
        // Where the trim lost the body, it is the API's. (A PR whose issue object still came
        // with a comment in the hour keeps that newer copy of the same text.)
        if lost.iter().any(|l| (&l.repo_name, l.number) == (&t.repo_name, t.number)) {
            assert_eq!(t.metadata_source, "github_api", "{}#{}", t.repo_name, t.number);
        }
    }
    // Next to the archive's untrimmed lake of the same hour: the same rows.
    let archive_dir = dir.path().join("archive");
    let b = archive_dir.to_str().unwrap();
    let (ok, out) =
        swelake(&["ingest", "--source", data_dir().join("2025-01-01-15.json").to_str().unwrap(), "--lake", b], &[]);
    assert!(ok, "{out}");
    let (ok, out) = swelake(&["run", "pull_requests", "issues", "--lake", b], &[]);
    assert!(ok, "{out}");
    assert_eq!(prs(&lake).await, prs(&Lake::open(b).unwrap()).await);

    // `swelake status`: per repository what the API filled.
    let (ok, out) = swelake(&["status", "--lake", a, "--json"], &[]);
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let rows = status["github_api"].as_array().unwrap();
    assert_eq!(rows.len(), names.len());
    for r in rows {
        let n = r["repo_name"].as_str().unwrap();
        let prs_served = data[n]["pulls"].as_array().unwrap().len() as i64;
        assert_eq!((r["status"].as_str(), r["calls_last_run"].as_i64()), (Some("ok"), Some(5)), "{r}");
        assert_eq!((r["not_modified_last_run"].as_i64(), r["calls_total"].as_i64()), (Some(5), Some(15)), "{r}");
        assert_eq!((r["prs_last_run"].as_i64(), r["prs_total"].as_i64()), (Some(0), Some(prs_served)), "{r}");
        assert!(r.get("etags").is_none());
    }
    let (ok, text) = swelake(&["status", "--lake", a], &[]);
    eprintln!("{text}");
    assert!(ok && text.contains("github api (ingest --github): 5 repositories, 75 calls in all"), "{text}");
}

/// A repository's issue object of the excerpt, moved to `repo` as issue `number`.
fn rehome(issue: &Value, repo: &str, number: i64) -> Value {
    let url = issue["url"].as_str().unwrap();
    let (old_repo, old_number) = {
        let rest = url.trim_start_matches("https://api.github.com/repos/");
        let (r, n) = rest.rsplit_once("/issues/").unwrap();
        (r.to_string(), n.to_string())
    };
    let text = issue
        .to_string()
        .replace(&format!("{old_repo}/issues/{old_number}"), &format!("{repo}/issues/{number}"))
        .replace(&format!("repos/{old_repo}\""), &format!("repos/{repo}\""));
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["number"] = number.into();
    v
}

/// PRs found in git alone state their problem with their own text; once the API has read the
/// issues they close, with those issues' text (`problem_source = issue`), and the card and the
/// console count them. The issues are real ones of the excerpt (Abhay-hack/Lumina#39,
/// rapid7/metasploit-framework#19605) moved to the made repository as #10 and #11, the
/// issues its PRs #1 and #2 close.
#[tokio::test(flavor = "multi_thread")]
async fn a_git_only_lake_states_its_problems_with_the_issues_the_api_reads() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    crate::git_prs::make_repo(&work);
    let src = dir.path().join("src").join("acme").join("widgets.git");
    crate::git_prs::git(dir.path(), &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
    let excerpt = excerpt_objects();
    let i10 = rehome(&excerpt["Abhay-hack/Lumina"]["issues"][0], "acme/widgets", 10);
    let i11 = rehome(&excerpt["rapid7/metasploit-framework"]["issues"][0], "acme/widgets", 11);
    let mut repo = excerpt["Abhay-hack/Lumina"]["repo"].clone();
    repo["full_name"] = "acme/widgets".into();
    repo["name"] = "widgets".into();
    repo["owner"]["login"] = "acme".into();
    let data = serde_json::json!({"acme/widgets": {"repo": repo, "pulls": [], "issues": [i10, i11], "comments": []}});
    let (base, _mock) = serve_api(data, vec![], 100).await;

    let repos = dir.path().join("repos.txt");
    std::fs::write(&repos, "acme/widgets\n").unwrap();
    let config = dir.path().join("curation.toml");
    std::fs::write(&config, "[relevance]\nranker = \"bm25\"\n").unwrap();
    let lake_dir = dir.path().join("lake");
    let a = lake_dir.to_str().unwrap();
    let url = format!("{}/{{repo}}.git", dir.path().join("src").display());
    let cache = dir.path().join("cache");
    let run = [
        "-q",
        "run",
        "--all",
        "--lake",
        a,
        "--repos-file",
        repos.to_str().unwrap(),
        "--repo-url",
        &url,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ];
    let (ok, out) = swelake(&run, &[]);
    assert!(ok, "{out}");
    let lake = Lake::open(a).unwrap();
    #[derive(Deserialize, PartialEq, Debug)]
    struct Seed {
        instance_id: String,
        problem_source: String,
        problem_statement: String,
    }
    let seed = |lake: Lake| async move {
        swelake::query::rows::<Seed>(
            &lake.session().await.unwrap(),
            "SELECT instance_id, problem_source, problem_statement FROM rl_seed ORDER BY instance_id",
        )
        .await
        .unwrap()
    };
    let first = seed(lake.clone()).await;
    assert_eq!(first.iter().map(|s| s.problem_source.as_str()).collect::<Vec<_>>(), ["pr_text", "pr_text"]);

    let (ok, out) = swelake(
        &["ingest", "--github", "--repos-file", repos.to_str().unwrap(), "--lake", a, "--api-url", &base],
        &[("GITHUB_TOKEN", TOKEN)],
    );
    assert!(ok, "{out}");
    let (ok, out) = swelake(&run, &[]);
    assert!(ok, "{out}");
    let second = seed(lake.clone()).await;
    assert_eq!(
        second.iter().map(|s| (s.instance_id.as_str(), s.problem_source.as_str())).collect::<Vec<_>>(),
        [("acme/widgets#1", "issue"), ("acme/widgets#2", "issue")]
    );
    for (s, issue) in second.iter().zip([&excerpt["Abhay-hack/Lumina"], &excerpt["rapid7/metasploit-framework"]]) {
        let issue = &issue["issues"][0];
        let (title, body) = (issue["title"].as_str().unwrap(), issue["body"].as_str().unwrap());
        assert!(s.problem_statement.contains(title), "{}: {}", s.instance_id, s.problem_statement);
        // The statement keeps the body's words (its line endings may be normalized).
        let first_line = body.lines().find(|l| l.trim().len() > 10).unwrap().trim();
        assert!(s.problem_statement.contains(first_line), "{}: {}", s.instance_id, s.problem_statement);
        assert!(!s.problem_statement.contains("IndexError"), "not the commit message: {}", s.problem_statement);
    }
    assert_eq!(
        crate::common::pairs(&lake, "SELECT metadata_source, count(*) FROM issues GROUP BY 1").await,
        [("github_api".to_string(), 2)]
    );

    // The card counts them, and the console shows what the API read.
    let card_dir = dir.path().join("card");
    let (ok, out) = swelake(&["report", "--lake", a, "--out", card_dir.to_str().unwrap()], &[]);
    assert!(ok, "{out}");
    let card = std::fs::read_to_string(card_dir.join("card.md")).unwrap();
    assert!(card.contains("| instances whose problem statement is an issue read through GitHub's API | 2 |"), "{card}");
    assert!(card.contains("read for 1 repository (1 answered ok): 5 calls in all, 0 PRs, 2 issues"), "{card}");
    let served = crate::console::serve(&["--lake", a], &[]);
    let (code, body) = crate::console::http(&served.http, "GET", "/api/github", None);
    assert_eq!(code, 200, "{body}");
    let g: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(g["repos"][0]["repo_name"], "acme/widgets");
    assert_eq!(
        (g["repos"][0]["issues_last_run"].as_i64(), g["repos"][0]["calls_last_run"].as_i64()),
        (Some(2), Some(5))
    );
    assert!(!body.contains("etag"), "{body}");
}

#[derive(Deserialize, Debug, PartialEq)]
struct ReviewRow {
    repo_name: String,
    pr_number: i64,
    kind: String,
    action: Option<String>,
    actor_login: Option<String>,
    text: Option<String>,
    text_author_login: Option<String>,
    review_state: Option<String>,
    comment_path: Option<String>,
}

async fn review_rows(lake: &Lake) -> Vec<ReviewRow> {
    swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT repo_name, pr_number, kind, action, actor_login, text, text_author_login, review_state, comment_path \
         FROM pr_timeline WHERE kind IN ('review', 'review_comment') ORDER BY repo_name, pr_number, kind, event_id",
    )
    .await
    .unwrap()
}

/// Review comments (one list for the whole repository, always read) and reviews (a call per
/// changed PR, with `--reviews`) of the hour's two repositories that have both, served as the
/// REST API spells them (tests/data/github/reviews_from_excerpt.py): the PR timelines hold the
/// archive's reviews and review comments.
#[tokio::test(flavor = "multi_thread")]
async fn reviews_and_review_comments_through_the_api_are_the_archives() {
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(data_dir().join("api-reviews-2025-01-01-15.json")).unwrap())
            .unwrap();
    let (base, mock) = serve_api(data.clone(), vec![], 100).await;
    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos.txt");
    let names: Vec<String> = data.as_object().unwrap().keys().cloned().collect();
    std::fs::write(&repos, names.join("\n")).unwrap();
    let r = repos.to_str().unwrap();

    // Without --reviews: the review comments, not the reviews; a call for the repository and
    // one per list.
    let plain_dir = dir.path().join("plain");
    let p = plain_dir.to_str().unwrap();
    let (ok, out) = swelake(
        &["ingest", "--github", "--repos-file", r, "--lake", p, "--api-url", &base],
        &[("GITHUB_TOKEN", TOKEN)],
    );
    assert!(ok, "{out}");
    assert_eq!(std::mem::take(&mut mock.lock().unwrap().log).len(), 5 * names.len());
    let (ok, out) = swelake(&["run", "pull_requests", "--lake", p], &[]);
    assert!(ok, "{out}");
    let plain = review_rows(&Lake::open(p).unwrap()).await;
    assert_eq!(plain.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["review_comment", "review_comment"]);

    let api_dir = dir.path().join("api");
    let a = api_dir.to_str().unwrap();
    let (ok, out) = swelake(
        &["ingest", "--github", "--reviews", "--repos-file", r, "--lake", a, "--api-url", &base],
        &[("GITHUB_TOKEN", TOKEN)],
    );
    assert!(ok, "{out}");
    // One more call per PR read: its reviews.
    let log = std::mem::take(&mut mock.lock().unwrap().log);
    assert_eq!(log.iter().filter(|(p, _)| p.ends_with("/reviews?per_page=100")).count(), 2, "{log:?}");
    assert_eq!(log.len(), 6 * names.len(), "{log:?}");
    let (ok, out) = swelake(&["run", "pull_requests", "--lake", a], &[]);
    assert!(ok, "{out}");

    let archive_dir = dir.path().join("archive");
    let b = archive_dir.to_str().unwrap();
    let hour = data_dir().join("reviews-2025-01-01-15.json");
    let (ok, out) = swelake(&["ingest", "--source", hour.to_str().unwrap(), "--lake", b], &[]);
    assert!(ok, "{out}");
    let (ok, out) = swelake(&["run", "pull_requests", "--lake", b], &[]);
    assert!(ok, "{out}");

    let got = review_rows(&Lake::open(a).unwrap()).await;
    assert_eq!(got.len(), 5, "3 reviews and 2 review comments: {got:?}");
    assert_eq!(got, review_rows(&Lake::open(b).unwrap()).await);
    assert!(got.iter().any(|r| r.review_state.as_deref() == Some("approved")), "{got:?}");
    let reviews: Vec<(String, Option<i64>)> = swelake::query::rows(
        &Lake::open(a).unwrap().session().await.unwrap(),
        "SELECT repo_name, reviews_last_run FROM github_api_repos ORDER BY repo_name",
    )
    .await
    .unwrap();
    assert_eq!(
        reviews,
        [("highlightjs/highlight.js".to_string(), Some(1)), ("minkphp/webdriver-classic-driver".to_string(), Some(2))]
    );
}

/// A repository renamed on GitHub: its old URLs answer 301 to the new name; the run follows
/// them, reads it under its new name, and keeps the name the repos file gives in the lake.
#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_repository_is_read_under_its_new_name() {
    let data = excerpt_objects();
    let (base, mock) = serve_api(data, vec![], 100).await;
    mock.lock().unwrap().renamed = vec![("abhay/Lumina-old".into(), "Abhay-hack/Lumina".into())];
    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos.txt");
    std::fs::write(&repos, "abhay/Lumina-old\n").unwrap();
    let lake_dir = dir.path().join("lake");
    let a = lake_dir.to_str().unwrap();
    let ingest = ["ingest", "--github", "--repos-file", repos.to_str().unwrap(), "--lake", a, "--api-url", &base];
    let (ok, out) = swelake(&ingest, &[("GITHUB_TOKEN", TOKEN)]);
    assert!(ok, "{out}");
    let log = std::mem::take(&mut mock.lock().unwrap().log);
    assert_eq!(log[0], ("/repos/abhay/Lumina-old".to_string(), 301), "{log:?}");
    assert_eq!(log.len(), 6, "the 301, then the repository and its four lists: {log:?}");
    // After the repository's object, the lists are asked under the new name.
    assert_eq!(log[1], ("/repos/Abhay-hack/Lumina".to_string(), 200), "{log:?}");
    assert!(log[2..].iter().all(|(p, s)| p.starts_with("/repos/Abhay-hack/Lumina/") && *s == 200), "{log:?}");
    let lake = Lake::open(a).unwrap();
    #[derive(Deserialize, Debug, PartialEq)]
    struct Row {
        repo_name: String,
        status: String,
        current_name: String,
        issues_last_run: i64,
    }
    let rows: Vec<Row> = swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT repo_name, status, current_name, issues_last_run FROM github_api_repos",
    )
    .await
    .unwrap();
    assert_eq!(
        rows,
        [Row {
            repo_name: "abhay/Lumina-old".into(),
            status: "ok".into(),
            current_name: "Abhay-hack/Lumina".into(),
            issues_last_run: 1
        }]
    );
    assert_eq!(
        crate::common::count(&lake, "SELECT count(*) FROM events WHERE repo_name = 'abhay/Lumina-old'").await,
        3
    );
    let (ok, text) = swelake(&["status", "--lake", a], &[]);
    assert!(ok && text.contains("abhay/Lumina-old (now Abhay-hack/Lumina)"), "{text}");
}
