//! Merged PRs found in git itself (the prs_from_git job): a repository made here with a
//! merge-commit PR, a squash-merged PR, a rebase-merged PR and PR refs, run through every job
//! from `--repos-file` alone; and the real histories of `../shared/history` with and without
//! their archive events.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use swelake::git::Mirrors;
use swelake::jobs::{run, GitOptions, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::{count, quiet_ingest};

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Maintainer")
        .env("GIT_AUTHOR_EMAIL", "maint@example.org")
        .env("GIT_COMMITTER_NAME", "Maintainer")
        .env("GIT_COMMITTER_EMAIL", "maint@example.org")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub(crate) fn write(dir: &Path, path: &str, text: &str) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Commits everything as `who`, at `when` (seconds), with `message`.
pub(crate) fn commit(dir: &Path, who: (&str, &str), when: i64, message: &str) -> String {
    git(dir, &["add", "-A"]);
    commit_staged(dir, who, when, message)
}

/// Commits the index as it is.
pub(crate) fn commit_staged(dir: &Path, who: (&str, &str), when: i64, message: &str) -> String {
    let date = format!("{when} +0000");
    let out = Command::new("git")
        .args(["-c", "commit.gpgsign=false", "commit", "-q", "-m", message])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", who.0)
        .env("GIT_AUTHOR_EMAIL", who.1)
        .env("GIT_COMMITTER_NAME", who.0)
        .env("GIT_COMMITTER_EMAIL", who.1)
        .env("GIT_AUTHOR_DATE", &date)
        .env("GIT_COMMITTER_DATE", &date)
        .output()
        .unwrap();
    assert!(out.status.success(), "commit: {}", String::from_utf8_lossy(&out.stderr));
    git(dir, &["rev-parse", "HEAD"])
}

pub(crate) fn merge(dir: &Path, branch: &str, when: i64, message: &str) -> String {
    let date = format!("{when} +0000");
    let out = Command::new("git")
        .args(["-c", "commit.gpgsign=false", "merge", "-q", "--no-ff", "-m", message, branch])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Maintainer")
        .env("GIT_AUTHOR_EMAIL", "maint@example.org")
        .env("GIT_COMMITTER_NAME", "GitHub")
        .env("GIT_COMMITTER_EMAIL", "noreply@github.com")
        .env("GIT_AUTHOR_DATE", &date)
        .env("GIT_COMMITTER_DATE", &date)
        .output()
        .unwrap();
    assert!(out.status.success(), "merge: {}", String::from_utf8_lossy(&out.stderr));
    git(dir, &["rev-parse", "HEAD"])
}

pub(crate) const ALICE: (&str, &str) = ("Alice", "1234+alice@users.noreply.github.com");
pub(crate) const BOB: (&str, &str) = ("Bob", "bob@example.org");

/// What the made repository holds, as git's own SHAs.
pub(crate) struct Made {
    pr1: (String, String, String),
    pr2: (String, String),
    pr4: (String, String, String),
}

/// A repository with four PRs landed four ways (and one still open), in `dir`.
pub(crate) fn make_repo(dir: &Path) -> Made {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    let app = "def run(items):\n    return items[0]\n\n\ndef size(items):\n    return len(items)\n";
    let util = (0..30).map(|i| format!("def helper_{i}(x):\n    return x + {i}\n\n")).collect::<String>();
    write(dir, "src/app.py", app);
    write(dir, "src/util.py", &util);
    write(dir, "README.md", "# widgets\n");
    write(dir, "docs/guide.md", "How to use widgets.\n");
    let t0 = 1_700_000_000;
    commit(dir, BOB, t0, "Initial import");

    // PR 1: a branch merged with GitHub's merge commit, after main moved on.
    git(dir, &["checkout", "-q", "-b", "feature-1"]);
    write(dir, "src/app.py", &app.replace("return items[0]", "return items[0] if items else None"));
    commit(dir, ALICE, t0 + 100, "Return None for no items");
    std::fs::remove_file(dir.join("src/util.py")).unwrap();
    write(dir, "src/helpers.py", &format!("{util}def helper_extra(x):\n    return x\n"));
    write(dir, "tests/test_app.py", "from src.app import run\n\n\ndef test_empty():\n    assert run([]) is None\n");
    commit(dir, ALICE, t0 + 200, "Move helpers and test the empty case");
    git(dir, &["checkout", "-q", "main"]);
    write(dir, "README.md", "# widgets\n\nSmall tools.\n");
    commit(dir, BOB, t0 + 300, "README: say what it is");
    let m1 = merge(
        dir,
        "feature-1",
        t0 + 400,
        "Merge pull request #1 from alice/feature-1\n\nFix crash on empty input\n\nCalling run([]) raised IndexError; it now returns None.\nFixes #10",
    );
    let pr1 = (git(dir, &["rev-parse", &format!("{m1}^1")]), git(dir, &["rev-parse", &format!("{m1}^2")]), m1);

    // PR 2: squash-merged: one commit on main whose subject ends in (#2).
    write(dir, "src/names.py", "def normalize(name):\n    return name.casefold().strip()\n");
    write(
        dir,
        "src/app.py",
        &format!(
            "{}\n\ndef names(xs):\n    return [x.strip() for x in xs]\n",
            std::fs::read_to_string(dir.join("src/app.py")).unwrap()
        ),
    );
    let s2 = commit(
        dir,
        ALICE,
        t0 + 500,
        "Handle unicode names (#2)\n\nNames are compared case-folded, so accented names match.\n\nCloses #11",
    );
    let pr2 = (git(dir, &["rev-parse", &format!("{s2}^1")]), s2.clone());

    // PR 3: rebase-merged. Its ref keeps the commit as pushed; main gets a rewritten copy.
    git(dir, &["checkout", "-q", "-b", "feature-3", &format!("{s2}^1")]);
    write(dir, "docs/guide.md", "How to use widgets.\n\nRun `widgets --help`.\n");
    let pushed3 = commit(dir, BOB, t0 + 600, "Document --help");
    git(dir, &["checkout", "-q", "main"]);
    git(dir, &["cherry-pick", &pushed3]);

    // PR 4: merged with a plain merge message: only its ref names it.
    git(dir, &["checkout", "-q", "-b", "feature-4"]);
    write(
        dir,
        "src/app.py",
        &std::fs::read_to_string(dir.join("src/app.py")).unwrap().replace("len(items)", "sum(1 for _ in items)"),
    );
    let h4 = commit(dir, BOB, t0 + 700, "Count items of any iterable");
    git(dir, &["checkout", "-q", "main"]);
    write(dir, "README.md", "# widgets\n\nSmall tools for lists.\n");
    commit(dir, BOB, t0 + 750, "README: lists");
    let m4 = merge(dir, "feature-4", t0 + 800, "Merge branch 'feature-4'");
    let pr4 = (git(dir, &["rev-parse", &format!("{m4}^1")]), h4.clone(), m4);

    // PR 5: still open.
    git(dir, &["checkout", "-q", "-b", "feature-5"]);
    write(dir, "src/app.py", "# not merged\n");
    let h5 = commit(dir, BOB, t0 + 900, "Rewrite everything");
    git(dir, &["checkout", "-q", "main"]);
    for (n, sha) in [(3, &pushed3), (4, &h4), (5, &h5)] {
        git(dir, &["update-ref", &format!("refs/pull/{n}/head"), sha]);
    }
    for b in ["feature-1", "feature-3", "feature-4", "feature-5"] {
        git(dir, &["branch", "-q", "-D", b]);
    }
    Made { pr1, pr2, pr4 }
}

/// `git diff --name-status -M` of a PR as (status letter, path, old path).
fn git_changes(dir: &Path, base: &str, head: &str) -> BTreeSet<(String, String, Option<String>)> {
    git(dir, &["diff", "--name-status", "-M", &format!("{base}...{head}")])
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let status = f[0][..1].to_string();
            match f.len() {
                3 => (status, f[2].to_string(), Some(f[1].to_string())),
                _ => (status, f[1].to_string(), None),
            }
        })
        .collect()
}

#[derive(Deserialize, Debug)]
struct Pr {
    number: i64,
    title: Option<String>,
    base_sha: Option<String>,
    head_sha: Option<String>,
    merge_commit_sha: Option<String>,
    git_kind: Option<String>,
    discovery_source: String,
    merge_source: String,
    author_login: Option<String>,
}

#[derive(Deserialize)]
struct FileRow {
    pr_number: i64,
    status: String,
    path: String,
    old_path: Option<String>,
}

#[tokio::test(flavor = "multi_thread")]
async fn prs_made_four_ways_are_found_in_git_and_become_seed_instances() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let made = make_repo(&work);
    let src = dir.path().join("src").join("acme").join("widgets.git");
    git(dir.path(), &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
    // A mirror clone keeps refs/pull/*: GitHub serves them the same way.
    assert!(git(&src, &["for-each-ref", "refs/pull"]).contains("refs/pull/4/head"));

    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let registry = Registry::load(None, None).unwrap();
    let mirrors = Mirrors::new(format!("{}/{{repo}}.git", dir.path().join("src").display()), dir.path().join("cache"));
    let mut git_opts = GitOptions::new(mirrors);
    git_opts.scope.repos = Some(vec!["acme/widgets".to_string()]);
    git_opts.discover_prs = true;
    let mut curation = swelake::jobs::CurationConfig::load(None).unwrap();
    curation.relevance.ranker = swelake::relevance::rank::Ranker::Bm25;
    let opts = RunOptions { git: Some(git_opts), all: true, curation, ..Default::default() };
    let wanted: Vec<String> = registry.jobs.keys().cloned().collect();
    let out = run(&lake, &registry, &wanted, &opts).await.unwrap();
    let job = |n: &str| out.iter().find(|s| s.job == n).unwrap();
    assert!(job("ingest").skipped_reason.is_some());
    assert_eq!(job("prs_from_git").notes["prs_found"], 3, "{:?}", job("prs_from_git"));

    let ctx = lake.session().await.unwrap();
    let prs: Vec<Pr> = swelake::query::rows(
        &ctx,
        "SELECT number, title, base_sha, head_sha, merge_commit_sha, git_kind, discovery_source, merge_source, author_login \
         FROM pull_requests ORDER BY number",
    )
    .await
    .unwrap();
    let by: BTreeMap<i64, &Pr> = prs.iter().map(|p| (p.number, p)).collect();
    assert_eq!(by.keys().copied().collect::<Vec<_>>(), vec![1, 2, 4], "rebase-merged #3 and open #5 are not found");
    let p1 = by[&1];
    assert_eq!(
        (p1.base_sha.as_deref(), p1.head_sha.as_deref(), p1.merge_commit_sha.as_deref()),
        (Some(made.pr1.0.as_str()), Some(made.pr1.1.as_str()), Some(made.pr1.2.as_str()))
    );
    assert_eq!(p1.title.as_deref(), Some("Fix crash on empty input"));
    assert_eq!(p1.git_kind.as_deref(), Some("merge_commit"));
    assert_eq!(p1.author_login.as_deref(), Some("alice"), "from the head commit's no-reply address");
    let p2 = by[&2];
    assert_eq!(
        (p2.base_sha.as_deref(), p2.head_sha.as_deref()),
        (Some(made.pr2.0.as_str()), Some(made.pr2.1.as_str()))
    );
    assert_eq!(p2.merge_commit_sha.as_deref(), Some(made.pr2.1.as_str()));
    assert_eq!(p2.title.as_deref(), Some("Handle unicode names"));
    assert_eq!(p2.git_kind.as_deref(), Some("squash"));
    let p4 = by[&4];
    assert_eq!(
        (p4.base_sha.as_deref(), p4.head_sha.as_deref(), p4.merge_commit_sha.as_deref()),
        (Some(made.pr4.0.as_str()), Some(made.pr4.1.as_str()), Some(made.pr4.2.as_str()))
    );
    assert_eq!(p4.title.as_deref(), Some("Count items of any iterable"), "a one-commit PR's title is its subject");
    assert_eq!(p4.git_kind.as_deref(), Some("pull_ref"));
    for p in &prs {
        assert_eq!((p.discovery_source.as_str(), p.merge_source.as_str()), ("git", "git"), "#{}", p.number);
    }

    // Their changed files are git's.
    let files: Vec<FileRow> =
        swelake::query::rows(&ctx, "SELECT pr_number, status, path, old_path FROM pr_files").await.unwrap();
    for (n, base, head) in [(1, &made.pr1.0, &made.pr1.1), (2, &made.pr2.0, &made.pr2.1), (4, &made.pr4.0, &made.pr4.1)]
    {
        let ours: BTreeSet<(String, String, Option<String>)> = files
            .iter()
            .filter(|f| f.pr_number == n)
            .map(|f| (f.status.clone(), f.path.clone(), f.old_path.clone()))
            .collect();
        assert_eq!(ours, git_changes(&work, base, head), "PR #{n}");
    }
    assert!(files.iter().any(|f| f.pr_number == 1 && f.status == "R"), "PR 1 has a rename");

    // Issue links from the commit texts; no issue text in git: the seed states the problem
    // with the PR's own text, and says so. PR 4 references no issue: not kept by default.
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_issue_links WHERE pr_number = 1 AND issue_number = 10").await, 1);
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_issue_links WHERE pr_number = 2 AND issue_number = 11").await, 1);
    let seed: Vec<(String, String)> =
        swelake::query::rows(&ctx, "SELECT instance_id, problem_source FROM rl_seed ORDER BY instance_id")
            .await
            .unwrap();
    assert_eq!(
        seed,
        vec![
            ("acme/widgets#1".to_string(), "pr_text".to_string()),
            ("acme/widgets#2".to_string(), "pr_text".to_string())
        ]
    );
    let problem: Vec<String> =
        swelake::query::rows(&ctx, "SELECT problem_statement FROM rl_seed WHERE instance_id = 'acme/widgets#1'")
            .await
            .unwrap();
    assert!(problem[0].contains("Fix crash on empty input") && problem[0].contains("IndexError"), "{problem:?}");
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pr_quality WHERE pr_number = 4 AND array_has(reasons, 'no_linked_issue')")
            .await,
        1
    );

    // PR-text instances can be turned off in the filters' config.
    let mut never = opts.clone();
    never.curation.filters.pr_text_problems = swelake::filters::PrTextProblems::Never;
    run(&lake, &registry, &wanted, &never).await.unwrap();
    assert_eq!(count(&lake, "SELECT count(*) FROM rl_seed").await, 0);

    // Nothing moved in git: nothing is read again.
    let again = run(&lake, &registry, &wanted, &opts).await.unwrap();
    let pg = again.iter().find(|s| s.job == "prs_from_git").unwrap();
    assert!(pg.partitions.is_empty(), "{pg:?}");
    assert!(again.iter().find(|s| s.job == "pull_requests").unwrap().partitions.is_empty());
    assert_eq!(count(&lake, "SELECT count(*) FROM rl_seed").await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_runs_a_lake_from_a_repos_file() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    make_repo(&work);
    let src = dir.path().join("src").join("acme").join("widgets.git");
    git(dir.path(), &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
    let list = dir.path().join("repos.txt");
    std::fs::write(&list, "# the lake's repositories\nacme/widgets\n\n").unwrap();
    let lake = dir.path().join("lake");
    let bin = env!("CARGO_BIN_EXE_swelake");
    let url = format!("{}/{{repo}}.git", dir.path().join("src").display());
    let out = Command::new(bin)
        .args(["-q", "run", "pull_requests", "--json", "--lake"])
        .arg(&lake)
        .arg("--repos-file")
        .arg(&list)
        .args(["--repo-url", &url, "--cache-dir"])
        .arg(dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let l = Lake::open(lake.to_str().unwrap()).unwrap();
    assert_eq!(count(&l, "SELECT count(*) FROM pull_requests WHERE discovery_source = 'git'").await, 3);

    // A bad line is named; --repos-file needs --repo-url.
    std::fs::write(&list, "acme/widgets\nnot a repo\n").unwrap();
    let out = Command::new(bin)
        .args(["-q", "run", "--all", "--lake"])
        .arg(&lake)
        .arg("--repos-file")
        .arg(&list)
        .args(["--repo-url", &url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("repos.txt:2") && err.contains("not a repository"), "{err}");
    let out = Command::new(bin)
        .args(["-q", "run", "--all", "--lake"])
        .arg(&lake)
        .arg("--repos-file")
        .arg(&list)
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--repo-url"));
}

#[derive(Deserialize)]
struct Expected {
    merge_commit: String,
    files: Vec<ExpectedFile>,
}

#[derive(Deserialize)]
struct ExpectedFile {
    path: String,
    old_path: Option<String>,
}

#[derive(Deserialize, PartialEq, Debug)]
struct ArchiveFields {
    number: i64,
    title: Option<String>,
    body: Option<String>,
    author_login: Option<String>,
    merged: Option<bool>,
    merge_source: String,
    base_sha: Option<String>,
    head_sha: Option<String>,
    merge_commit_sha: Option<String>,
    created_at: Option<i64>,
    timeline_events: i64,
}

#[tokio::test(flavor = "multi_thread")]
async fn real_histories_give_their_merged_prs_from_git_alone_and_beside_the_archive() {
    let Some(history) = crate::common::history() else { return };
    for name in ["pallets/jinja", "pallets/werkzeug"] {
        let stem = name.replace('/', "-");
        let dir = tempfile::tempdir().unwrap();
        crate::common::mirror_of_bundle(&history, name, dir.path());
        let registry = Registry::load(None, None).unwrap();
        let mirrors =
            Mirrors::new(format!("{}/{{repo}}.git", dir.path().join("src").display()), dir.path().join("cache"));
        let mut g = GitOptions::new(mirrors);
        g.scope.repos = Some(vec![name.to_string()]);
        g.discover_prs = true;
        let opts = RunOptions { git: Some(g), ..Default::default() };
        let expected: BTreeMap<String, Expected> =
            serde_json::from_str(&std::fs::read_to_string(history.join(&stem).join("expected.json")).unwrap()).unwrap();
        let hour = dir.path().join("2011-04-25-18.json");
        let reused = crate::history::concatenated(&history.join(&stem).join("events"), &hour);

        // From git alone: every `Merge pull request` PR, with git's changed files.
        let lake = Lake::open(dir.path().join("git-only").to_str().unwrap()).unwrap();
        let started = std::time::Instant::now();
        let out = run(&lake, &registry, &["snapshots".to_string()], &opts).await.unwrap();
        let found = out.iter().find(|s| s.job == "prs_from_git").unwrap();
        eprintln!("{name}: {:?} in {:.1}s (with snapshots)", found.notes, started.elapsed().as_secs_f64());
        let ctx = lake.session().await.unwrap();
        let facts: Vec<(i64, String)> =
            swelake::query::rows(&ctx, "SELECT number, merge_commit_sha FROM pr_git_facts").await.unwrap();
        let facts: BTreeMap<i64, String> = facts.into_iter().collect();
        let files: Vec<(i64, String, Option<String>)> =
            swelake::query::rows(&ctx, "SELECT pr_number, path, old_path FROM pr_files").await.unwrap();
        let mut paths: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
        for (n, p, o) in files {
            let e = paths.entry(n).or_default();
            e.insert(p);
            e.extend(o);
        }
        let mut compared = 0;
        for (key, e) in &expected {
            let n: i64 = key.rsplit('#').next().unwrap().parse().unwrap();
            if reused.contains(&n) {
                continue;
            }
            assert_eq!(facts.get(&n), Some(&e.merge_commit), "{key}: found, with its merge commit");
            let want: BTreeSet<String> =
                e.files.iter().flat_map(|f| std::iter::once(f.path.clone()).chain(f.old_path.clone())).collect();
            assert_eq!(paths.get(&n).cloned().unwrap_or_default(), want, "{key}: changed paths");
            compared += 1;
        }
        assert!(compared > 400, "{name}: {compared}");
        assert_eq!(count(&lake, "SELECT count(*) FROM pr_snapshots WHERE status <> 'ok'").await, 0);

        // Beside the archive: no PR twice, and the archive's fields as they were.
        let lake = Lake::open(dir.path().join("archive").to_str().unwrap()).unwrap();
        swelake::ingest::run(&lake, &quiet_ingest(&hour)).await.unwrap();
        let archive_only = RunOptions::default();
        run(&lake, &registry, &["pull_requests".to_string()], &archive_only).await.unwrap();
        let fields =
            "SELECT number, title, body, author_login, merged, merge_source, base_sha, head_sha, merge_commit_sha, \
                      CAST(created_at AS BIGINT) AS created_at, timeline_events FROM pull_requests";
        let read = |lake: Lake, sql: String| async move {
            let ctx = lake.session().await.unwrap();
            swelake::query::rows::<ArchiveFields>(&ctx, &sql).await.unwrap()
        };
        let before = read(lake.clone(), format!("{fields} ORDER BY number")).await;
        run(&lake, &registry, &["pull_requests".to_string()], &opts).await.unwrap();
        let after = read(lake.clone(), format!("{fields} WHERE discovery_source = 'gh_archive' ORDER BY number")).await;
        assert_eq!(before.len(), after.len());
        assert!(before == after, "{name}: the archive's rows are unchanged");
        let total = count(&lake, "SELECT count(*) FROM pull_requests").await;
        assert_eq!(total, count(&lake, "SELECT count(DISTINCT number) FROM pull_requests").await, "no PR twice");
        assert!(total > before.len() as i64, "{name}: git adds PRs the archive lacks");
        eprintln!("{name}: {} PRs from the archive, {} more from git", before.len(), total - before.len() as i64);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_older_pull_requests_table_gains_the_new_columns() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let contract = swelake::schema::arrow("pull_requests").unwrap();
    let n = contract.fields().len();
    assert_eq!(contract.field(n - 2).name(), "discovery_source");
    // The table as the version before git discovery wrote it, with one row.
    let old = arrow::datatypes::Schema::new(contract.fields()[..n - 2].to_vec());
    let row = serde_json::json!({"repo_name": "o/r", "number": 1, "merge_source": "unknown", "metadata_source": "none", "timeline_events": 1});
    let batch = arrow::json::ReaderBuilder::new(std::sync::Arc::new(old.clone()))
        .build(std::io::Cursor::new(row.to_string()))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let t = lake.ensure_table("pull_requests", &old, &[]).await.unwrap();
    lake.append(t, vec![batch]).await.unwrap();
    let t = lake.ensure_contract_table("pull_requests").await.unwrap();
    let names: Vec<String> =
        t.snapshot().unwrap().snapshot().arrow_schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names.len(), n);
    assert_eq!(&names[n - 2..], ["discovery_source", "git_kind"]);
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pull_requests WHERE discovery_source IS NULL AND number = 1").await,
        1
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn symlinks_submodules_and_type_changes_are_git_s_and_never_code() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    let app = "def run(items):\n    return items[0]\n";
    write(&work, "app.py", app);
    write(&work, "tool.sh", "#!/bin/sh\necho tool\n");
    git(&work, &["add", "-A"]);
    let sub = |n: u8| format!("{:040x}", n);
    git(&work, &["update-index", "--add", "--cacheinfo", &format!("160000,{},vendor/lib", sub(1))]);
    let t0 = 1_700_000_000;
    commit_staged(&work, BOB, t0, "Initial import");
    let base1 = git(&work, &["rev-parse", "HEAD"]);

    // PR 1: a code change, a new symlink, a file that becomes a symlink, a submodule moved on.
    write(&work, "app.py", &app.replace("items[0]", "items[0] if items else None"));
    std::os::unix::fs::symlink("app.py", work.join("link.py")).unwrap();
    std::fs::remove_file(work.join("tool.sh")).unwrap();
    std::os::unix::fs::symlink("app.py", work.join("tool.sh")).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["update-index", "--add", "--cacheinfo", &format!("160000,{},vendor/lib", sub(2))]);
    let head1 = commit_staged(
        &work,
        ALICE,
        t0 + 100,
        "Return None for no items (#1)\n\nrun([]) raised IndexError; it returns None now. Fixes #3",
    );
    // PR 2: only a symlink's target and the submodule pointer.
    std::fs::remove_file(work.join("link.py")).unwrap();
    std::os::unix::fs::symlink("tool.sh", work.join("link.py")).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["update-index", "--add", "--cacheinfo", &format!("160000,{},vendor/lib", sub(3))]);
    let head2 = commit_staged(
        &work,
        ALICE,
        t0 + 200,
        "Point the link at the tool and bump the vendored lib (#2)\n\nFixes #4, which asked for exactly this change.",
    );

    let src = dir.path().join("src").join("acme").join("links.git");
    git(dir.path(), &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let registry = Registry::load(None, None).unwrap();
    let mut g = GitOptions::new(Mirrors::new(
        format!("{}/{{repo}}.git", dir.path().join("src").display()),
        dir.path().join("cache"),
    ));
    g.scope.repos = Some(vec!["acme/links".to_string()]);
    g.discover_prs = true;
    let mut curation = swelake::jobs::CurationConfig::load(None).unwrap();
    curation.relevance.ranker = swelake::relevance::rank::Ranker::Bm25;
    let opts = RunOptions { git: Some(g), all: true, curation, ..Default::default() };
    let wanted: Vec<String> = registry.jobs.keys().cloned().collect();
    run(&lake, &registry, &wanted, &opts).await.unwrap();

    #[derive(Deserialize)]
    struct F {
        pr_number: i64,
        status: String,
        path: String,
        old_path: Option<String>,
        old_mode: i64,
        new_mode: i64,
        new_blob: Option<String>,
        language: Option<String>,
    }
    let ctx = lake.session().await.unwrap();
    let files: Vec<F> = swelake::query::rows(
        &ctx,
        "SELECT pr_number, status, path, old_path, old_mode, new_mode, new_blob, language FROM pr_files ORDER BY pr_number, path",
    )
    .await
    .unwrap();
    for (n, base, head) in [(1, &base1, &head1), (2, &head1, &head2)] {
        let ours: BTreeSet<(String, String, Option<String>)> = files
            .iter()
            .filter(|f| f.pr_number == n)
            .map(|f| (f.status.clone(), f.path.clone(), f.old_path.clone()))
            .collect();
        assert_eq!(ours, git_changes(&work, base, head), "PR #{n}");
    }
    let one = |n: i64, p: &str| files.iter().find(|f| f.pr_number == n && f.path == p).unwrap();
    assert_eq!((one(1, "link.py").status.as_str(), one(1, "link.py").new_mode), ("A", 0o120000));
    assert_eq!(
        (one(1, "tool.sh").status.as_str(), one(1, "tool.sh").old_mode, one(1, "tool.sh").new_mode),
        ("T", 0o100644, 0o120000)
    );
    let lib = one(1, "vendor/lib");
    assert_eq!((lib.status.as_str(), lib.new_mode, lib.new_blob.as_deref()), ("M", 0o160000, None));
    for p in ["link.py", "tool.sh", "vendor/lib"] {
        assert_eq!(one(1, p).language, None, "{p} is no code");
    }
    assert_eq!(one(1, "app.py").language.as_deref(), Some("Python"));
    // PR 2 changes no code; PR 1 becomes an instance that shows and edits app.py only.
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pr_quality WHERE pr_number = 2 AND array_has(reasons, 'no_code_change')")
            .await,
        1
    );
    let seed: Vec<(String, String)> =
        swelake::query::rows(&ctx, "SELECT instance_id, prompt[2]['content'] FROM rl_seed").await.unwrap();
    assert_eq!(seed.len(), 1, "{seed:?}");
    assert_eq!(seed[0].0, "acme/links#1");
    assert!(seed[0].1.contains("app.py"), "{}", seed[0].1);
    for p in ["link.py", "tool.sh", "vendor/lib"] {
        assert!(!seed[0].1.contains(&format!("### {p}")), "{p} is shown in the prompt:\n{}", seed[0].1);
    }
}
