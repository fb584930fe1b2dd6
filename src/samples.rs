//! The demo's sample world, made by code: two small git repositories of a fictional
//! organisation and the GH Archive hours that describe their pull requests.
//!
//! Everything is deterministic (fixed contents, signatures and timestamps), so the commit
//! SHAs never change: the hour files in `data-samples/gharchive/` are written by
//! [`write_hours`] from the same code that builds the repositories, and a test checks that
//! they still agree. No third-party repository is involved.
//!
//! - `swelake-samples/calc` (Python): a bug fix that resolves an issue (#2 fixes #1), a bot's
//!   version bump (#3), and, after GitHub's 2025-10-07 payload trim, a fix that renames a
//!   module, deletes one and adds a binary file (#7 fixes #6) and an unmerged PR (#9).
//! - `swelake-samples/textkit` (Rust + JavaScript): a fix touching both languages (#4 fixes #3).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use git2::{Oid, Repository, Signature, Time};
use serde_json::{json, Value};

pub const ORG: &str = "swelake-samples";

/// A generated repository and the named commits of its history.
#[derive(Debug, Clone)]
pub struct SampleRepo {
    pub name: String,
    pub id: i64,
    pub path: PathBuf,
    pub commits: BTreeMap<&'static str, Oid>,
}

impl SampleRepo {
    pub fn sha(&self, name: &str) -> String {
        self.commits[name].to_string()
    }
}

type Files = BTreeMap<String, Vec<u8>>;

fn files(list: &[(&str, &[u8])]) -> Files {
    list.iter().map(|(p, c)| (p.to_string(), c.to_vec())).collect()
}

/// Writes a (nested) tree for `files` and returns its id.
fn write_tree(repo: &Repository, files: &Files) -> Result<Oid> {
    let mut dirs: BTreeMap<String, Files> = BTreeMap::new();
    let mut builder = repo.treebuilder(None)?;
    for (path, content) in files {
        match path.split_once('/') {
            Some((dir, rest)) => {
                dirs.entry(dir.to_string()).or_default().insert(rest.to_string(), content.clone());
            }
            None => {
                let blob = repo.blob(content)?;
                builder.insert(path, blob, 0o100644)?;
            }
        }
    }
    for (dir, sub) in dirs {
        let tree = write_tree(repo, &sub)?;
        builder.insert(&dir, tree, 0o040000)?;
    }
    Ok(builder.write()?)
}

/// 2025-01-06T09:00:00Z and 2025-11-03T13:00:00Z, the two periods of the story.
const JAN: i64 = 1_736_154_000;
const NOV: i64 = 1_762_174_800;

fn commit(repo: &Repository, who: (&str, &str), at: i64, message: &str, files: &Files, parents: &[Oid]) -> Result<Oid> {
    let sig = Signature::new(who.0, who.1, &Time::new(at, 0))?;
    let tree = repo.find_tree(write_tree(repo, files)?)?;
    let parents: Vec<git2::Commit> = parents.iter().map(|p| repo.find_commit(*p)).collect::<Result<_, _>>()?;
    let refs: Vec<&git2::Commit> = parents.iter().collect();
    Ok(repo.commit(None, &sig, &sig, message, &tree, &refs)?)
}

const JONAS: (&str, &str) = ("Jonas Weber", "jonas@example.org");
const MIRA: (&str, &str) = ("Mira Okafor", "mira@example.org");
const RAVI: (&str, &str) = ("Ravi Iyer", "ravi@example.org");
const LENA: (&str, &str) = ("Lena Novak", "lena@example.org");
const BOT: (&str, &str) = ("dependabot[bot]", "49699333+dependabot[bot]@users.noreply.github.com");

/// A small PNG-like binary (NUL bytes make git treat it as binary).
fn png(seed: u8) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    v.extend((0..200u16).map(|i| (i as u8).wrapping_mul(seed) ^ 0x5a));
    v
}

fn calc(dir: &Path) -> Result<SampleRepo> {
    let path = dir.join(format!("{ORG}/calc.git"));
    let repo = Repository::init_bare(&path)?;
    let mut c = BTreeMap::new();
    let ops_v0: &[u8] = b"def add(a, b):\n    return a + b\n\n\ndef divide(a, b):\n    return a / b\n";
    let stats_v0: &[u8] = b"def mean(values):\n    return sum(values) / len(values)\n";
    let mut f = files(&[
        ("README.md", b"# calc\n\nA tiny calculator.\n"),
        ("calc/__init__.py", b"from .ops import add, divide\nfrom .stats import mean\n"),
        ("calc/ops.py", ops_v0),
        ("calc/stats.py", stats_v0),
        ("calc/legacy.py", b"def old_add(a, b):\n    return add(a, b)\n"),
        ("tests/test_ops.py", b"from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"),
        ("requirements-dev.txt", b"pytest==7.4.0\n"),
        ("docs/logo.png", &png(3)),
    ]);
    let c0 = commit(&repo, MIRA, JAN, "Initial calculator\n", &f, &[])?;
    c.insert("c0", c0);

    // PR #2 (fixes #1): divide() returns None for a zero divisor.
    f.insert(
        "calc/ops.py".into(),
        b"def add(a, b):\n    return a + b\n\n\ndef divide(a, b):\n    if b == 0:\n        return None\n    return a / b\n".to_vec(),
    );
    f.insert(
        "tests/test_ops.py".into(),
        b"from calc import add, divide\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\ndef test_divide_by_zero():\n    assert divide(1, 0) is None\n".to_vec(),
    );
    let f1 = commit(&repo, JONAS, JAN + 360, "Guard divide() against zero divisors\n\nresolves #1\n", &f, &[c0])?;
    c.insert("pr2_head", f1);
    let m2 = commit(
        &repo,
        MIRA,
        JAN + 1800,
        "Merge pull request #2 from jonas/fix-2\n\nReturn None when dividing by zero\n",
        &f,
        &[c0, f1],
    )?;
    c.insert("pr2_merge", m2);

    // PR #3: the bot's version bump.
    f.insert("requirements-dev.txt".into(), b"pytest==8.0.0\n".to_vec());
    let b1 = commit(&repo, BOT, JAN + 2100, "Bump pytest from 7.4.0 to 8.0.0\n", &f, &[m2])?;
    c.insert("pr3_head", b1);
    let m3 = commit(
        &repo,
        MIRA,
        JAN + 2400,
        "Merge pull request #3 from swelake-samples/dependabot/pytest-8.0.0\n",
        &f,
        &[m2, b1],
    )?;
    c.insert("pr3_merge", m3);

    // PR #7 (fixes #6), trimmed era: rename stats.py, delete legacy.py, add a diagram.
    let stats_v1 =
        b"def mean(values):\n    if not values:\n        return None\n    return sum(values) / len(values)\n".to_vec();
    f.remove("calc/stats.py");
    f.remove("calc/legacy.py");
    f.insert("calc/statistics.py".into(), stats_v1);
    f.insert("calc/__init__.py".into(), b"from .ops import add, divide\nfrom .statistics import mean\n".to_vec());
    f.insert("docs/diagram.png".into(), png(7));
    let s1 = commit(&repo, RAVI, NOV + 3600, "Handle empty input in mean()\n\nFixes #6\n", &f, &[m3])?;
    c.insert("pr7_first", s1);
    f.insert(
        "tests/test_stats.py".into(),
        b"from calc import mean\n\n\ndef test_mean_empty():\n    assert mean([]) is None\n".to_vec(),
    );
    let s2 = commit(&repo, RAVI, NOV + 4500, "Add tests for mean()\n", &f, &[s1])?;
    c.insert("pr7_head", s2);
    let m7 = commit(&repo, MIRA, NOV + 5400, "Merge pull request #7 from ravi/fix-7\n", &f, &[m3, s2])?;
    c.insert("pr7_merge", m7);

    // PR #9: opened and closed without merging.
    let mut g = f.clone();
    g.insert("calc/ops.py".into(), b"def add(a, b):\n    return b + a\n\n\ndef divide(a, b):\n    if b == 0:\n        return None\n    return a / b\n".to_vec());
    let n1 = commit(&repo, RAVI, NOV + 6000, "Reorder add() operands\n", &g, &[m7])?;
    c.insert("pr9_head", n1);

    repo.reference("refs/heads/main", m7, true, "sample history")?;
    repo.reference("refs/heads/fix-9", n1, true, "sample history")?;
    repo.set_head("refs/heads/main")?;
    // GitHub keeps every PR's head under refs/pull/N/head, merged or not.
    for (n, head) in [(2, f1), (3, b1), (7, s2), (9, n1)] {
        repo.reference(&format!("refs/pull/{n}/head"), head, true, "sample history")?;
    }
    Ok(SampleRepo { name: format!("{ORG}/calc"), id: 700_001, path, commits: c })
}

fn textkit(dir: &Path) -> Result<SampleRepo> {
    let path = dir.join(format!("{ORG}/textkit.git"));
    let repo = Repository::init_bare(&path)?;
    let mut c = BTreeMap::new();
    let mut f = files(&[
        ("Cargo.toml", b"[package]\nname = \"textkit\"\nversion = \"0.1.0\"\nedition = \"2021\"\n"),
        (
            "src/lib.rs",
            b"/// Number of words in `text`.\npub fn word_count(text: &str) -> usize {\n    text.split(' ').filter(|w| !w.is_empty()).count()\n}\n",
        ),
        ("web/format.js", b"export function formatCount(n) {\n  return n + ' words';\n}\n"),
        ("README.md", b"# textkit\n\nText utilities.\n"),
    ]);
    let t0 = commit(&repo, LENA, JAN + 1200, "Initial textkit\n", &f, &[])?;
    c.insert("c0", t0);
    f.insert(
        "src/lib.rs".into(),
        b"/// Number of words in `text`.\npub fn word_count(text: &str) -> usize {\n    text.split_whitespace().count()\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn tabs_and_runs_of_spaces() {\n        assert_eq!(super::word_count(\"a\\tb  c\"), 3);\n    }\n}\n".to_vec(),
    );
    f.insert(
        "web/format.js".into(),
        b"export function formatCount(n) {\n  return n === 1 ? '1 word' : n + ' words';\n}\n".to_vec(),
    );
    let t1 = commit(&repo, LENA, JAN + 2700, "Count words separated by any whitespace\n\nFixes #3\n", &f, &[t0])?;
    c.insert("pr4_head", t1);
    let m4 = commit(&repo, LENA, JAN + 3300, "Merge pull request #4 from lena/whitespace\n", &f, &[t0, t1])?;
    c.insert("pr4_merge", m4);
    repo.reference("refs/heads/main", m4, true, "sample history")?;
    repo.set_head("refs/heads/main")?;
    repo.reference("refs/pull/4/head", t1, true, "sample history")?;
    Ok(SampleRepo { name: format!("{ORG}/textkit"), id: 700_002, path, commits: c })
}

/// Creates the sample repositories under `dir` (as `dir/swelake-samples/NAME.git`, so the
/// URL template is `dir/{repo}.git`), replacing earlier copies.
pub fn create_repos(dir: &Path) -> Result<Vec<SampleRepo>> {
    let org = dir.join(ORG);
    if org.exists() {
        std::fs::remove_dir_all(&org).with_context(|| format!("clearing {}", org.display()))?;
    }
    Ok(vec![
        calc(dir).context("building the calc sample repository")?,
        textkit(dir).context("building the textkit sample repository")?,
    ])
}

// ---------------------------------------------------------------------------------------
// GH Archive hours

struct Ids(u64);

impl Ids {
    fn next(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

fn user(login: &str, id: i64, kind: &str) -> Value {
    json!({"login": login, "id": id, "type": kind, "site_admin": false})
}

fn actor(login: &str, id: i64) -> Value {
    json!({"id": id, "login": login, "display_login": login.trim_end_matches("[bot]"), "gravatar_id": "",
           "url": format!("https://api.github.com/users/{login}"), "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?")})
}

fn repo_obj(r: &SampleRepo) -> Value {
    json!({"id": r.id, "name": r.name, "url": format!("https://api.github.com/repos/{}", r.name)})
}

fn event(ids: &mut Ids, kind: &str, who: (&str, i64), r: &SampleRepo, payload: Value, at: &str) -> Value {
    json!({"id": ids.next(), "type": kind, "actor": actor(who.0, who.1), "repo": repo_obj(r), "payload": payload,
           "public": true, "created_at": at, "org": {"id": 9000, "login": ORG}})
}

struct Pr<'a> {
    repo: &'a SampleRepo,
    number: i64,
    title: &'a str,
    body: &'a str,
    author: (&'a str, i64, &'a str),
    head_ref: &'a str,
    head: String,
    base: String,
    created: &'a str,
}

fn pr_full(
    p: &Pr,
    state: &str,
    merged: bool,
    merged_at: Option<&str>,
    merge_sha: Option<String>,
    closed: Option<&str>,
    labels: &[&str],
) -> Value {
    let side = |r: &str, sha: &str| {
        json!({"label": format!("{}:{}", p.author.0, r), "ref": r, "sha": sha,
        "repo": {"id": p.repo.id, "name": p.repo.name.split('/').nth(1), "full_name": p.repo.name}})
    };
    json!({
        "url": format!("https://api.github.com/repos/{}/pulls/{}", p.repo.name, p.number), "id": p.repo.id * 1000 + p.number,
        "number": p.number, "state": state, "locked": false, "title": p.title, "user": user(p.author.0, p.author.1, p.author.2),
        "body": p.body, "created_at": p.created, "updated_at": closed.unwrap_or(p.created), "closed_at": closed,
        "merged_at": merged_at, "merge_commit_sha": merge_sha, "labels": labels.iter().map(|l| json!({"name": l})).collect::<Vec<_>>(),
        "draft": false, "head": side(p.head_ref, &p.head), "base": side("main", &p.base), "author_association": "CONTRIBUTOR",
        "merged": merged, "comments": 1, "review_comments": 0, "commits": 1, "additions": 3, "deletions": 1, "changed_files": 2,
    })
}

/// The trimmed PR payload of 2025-10-07 onward (GitHub cut the Events API payloads that day).
fn pr_stub(p: &Pr, head: &str) -> Value {
    let side = |r: &str, sha: &str| json!({"ref": r, "sha": sha, "repo": {"id": p.repo.id, "url": format!("https://api.github.com/repos/{}", p.repo.name), "name": p.repo.name}});
    json!({"id": p.repo.id * 1000 + p.number, "number": p.number, "url": format!("https://api.github.com/repos/{}/pulls/{}", p.repo.name, p.number),
           "head": side(p.head_ref, head), "base": side("main", &p.base)})
}

fn issue(
    r: &SampleRepo,
    number: i64,
    title: &str,
    body: &str,
    author: (&str, i64),
    pr_merged_at: Option<Option<&str>>,
    labels: &[&str],
) -> Value {
    let mut o = json!({"url": format!("https://api.github.com/repos/{}/issues/{number}", r.name), "number": number, "title": title,
        "user": user(author.0, author.1, "User"), "labels": labels.iter().map(|l| json!({"name": l})).collect::<Vec<_>>(),
        "state": "open", "comments": 0, "created_at": "2025-01-06T09:00:00Z", "updated_at": "2025-01-06T10:00:00Z",
        "closed_at": null, "body": body});
    if let Some(merged_at) = pr_merged_at {
        o["pull_request"] =
            json!({"url": format!("https://api.github.com/repos/{}/pulls/{number}", r.name), "merged_at": merged_at});
    }
    o
}

fn hour_2025_01_06(calc: &SampleRepo, textkit: &SampleRepo) -> Vec<Value> {
    let mut ids = Ids(48_000_000_000);
    let mut ev = Vec::new();
    let (mira, jonas, lena) = (("mira", 101), ("jonas", 102), ("lena", 104));
    ev.push(event(&mut ids, "IssuesEvent", mira, calc, json!({"action": "opened", "issue": issue(calc, 1,
        "divide() crashes with ZeroDivisionError",
        "Calling `calc.divide(1, 0)` raises ZeroDivisionError instead of returning None as documented.", mira, None, &["bug"])}),
        "2025-01-06T10:01:00Z"));
    let pr2 = Pr {
        repo: calc,
        number: 2,
        title: "Return None when dividing by zero",
        body: "Fixes #1.\n\n<!-- checklist: tests added -->",
        author: ("jonas", 102, "User"),
        head_ref: "fix-2",
        head: calc.sha("pr2_head"),
        base: calc.sha("c0"),
        created: "2025-01-06T10:05:00Z",
    };
    ev.push(event(
        &mut ids,
        "PullRequestEvent",
        jonas,
        calc,
        json!({"action": "opened", "number": 2, "pull_request": pr_full(&pr2, "open", false, None, None, None, &[])}),
        "2025-01-06T10:05:00Z",
    ));
    ev.push(event(
        &mut ids,
        "PushEvent",
        jonas,
        calc,
        json!({"repository_id": calc.id, "push_id": 1, "size": 1, "distinct_size": 1,
        "ref": "refs/heads/fix-2", "head": calc.sha("pr2_head"), "before": "0000000000000000000000000000000000000000",
        "commits": [{"sha": calc.sha("pr2_head"), "author": {"email": JONAS.1, "name": JONAS.0},
                     "message": "Guard divide() against zero divisors\n\nresolves #1", "distinct": true}]}),
        "2025-01-06T10:06:00Z",
    ));
    ev.push(event(&mut ids, "PullRequestReviewEvent", mira, calc, json!({"action": "created",
        "review": {"id": 5001, "user": user("mira", 101, "User"), "body": "Looks good, thanks!", "state": "approved", "submitted_at": "2025-01-06T10:20:00Z"},
        "pull_request": pr_full(&pr2, "open", false, None, None, None, &[])}), "2025-01-06T10:20:00Z"));
    ev.push(event(&mut ids, "PullRequestEvent", mira, calc, json!({"action": "closed", "number": 2,
        "pull_request": pr_full(&pr2, "closed", true, Some("2025-01-06T10:30:00Z"), Some(calc.sha("pr2_merge")), Some("2025-01-06T10:30:00Z"), &[])}),
        "2025-01-06T10:30:00Z"));
    let pr3 = Pr {
        repo: calc,
        number: 3,
        title: "Bump pytest from 7.4.0 to 8.0.0",
        body: "Bumps [pytest](https://github.com/pytest-dev/pytest) from 7.4.0 to 8.0.0.",
        author: ("dependabot[bot]", 49_699_333, "Bot"),
        head_ref: "dependabot/pytest-8.0.0",
        head: calc.sha("pr3_head"),
        base: calc.sha("pr2_merge"),
        created: "2025-01-06T10:35:00Z",
    };
    ev.push(event(&mut ids, "PullRequestEvent", ("dependabot[bot]", 49_699_333), calc, json!({"action": "closed", "number": 3,
        "pull_request": pr_full(&pr3, "closed", true, Some("2025-01-06T10:40:00Z"), Some(calc.sha("pr3_merge")), Some("2025-01-06T10:40:00Z"), &["dependencies"])}),
        "2025-01-06T10:40:00Z"));
    // textkit: issue #3, fixed by PR #4 in Rust and JavaScript.
    ev.push(event(&mut ids, "IssuesEvent", ("ravi", 103), textkit, json!({"action": "opened", "issue": issue(textkit, 3,
        "word_count() miscounts tabs and repeated spaces",
        "`word_count(\"a\\tb  c\")` returns 2; it should count 3 words whatever whitespace separates them.", ("ravi", 103), None, &["bug"])}),
        "2025-01-06T10:42:00Z"));
    let pr4 = Pr {
        repo: textkit,
        number: 4,
        title: "Count words separated by any whitespace",
        body: "Fixes #3 by splitting on any whitespace.",
        author: ("lena", 104, "User"),
        head_ref: "whitespace",
        head: textkit.sha("pr4_head"),
        base: textkit.sha("c0"),
        created: "2025-01-06T10:45:00Z",
    };
    ev.push(event(
        &mut ids,
        "PullRequestEvent",
        lena,
        textkit,
        json!({"action": "opened", "number": 4, "pull_request": pr_full(&pr4, "open", false, None, None, None, &[])}),
        "2025-01-06T10:45:00Z",
    ));
    ev.push(event(&mut ids, "PullRequestEvent", lena, textkit, json!({"action": "closed", "number": 4,
        "pull_request": pr_full(&pr4, "closed", true, Some("2025-01-06T10:55:00Z"), Some(textkit.sha("pr4_merge")), Some("2025-01-06T10:55:00Z"), &[])}),
        "2025-01-06T10:55:00Z"));
    ev.push(event(&mut ids, "WatchEvent", ("ravi", 103), calc, json!({"action": "started"}), "2025-01-06T10:58:00Z"));
    ev
}

fn hour_2025_11_03(calc: &SampleRepo) -> Vec<String> {
    let mut ids = Ids(49_000_000_000);
    let mut ev = Vec::new();
    let (mira, ravi) = (("mira", 101), ("ravi", 103));
    let pr7 = Pr {
        repo: calc,
        number: 7,
        title: "Handle empty input in mean()",
        body: "mean([]) divides by zero. Fixes #6",
        author: ("ravi", 103, "User"),
        head_ref: "fix-7",
        head: calc.sha("pr7_head"),
        base: calc.sha("pr3_merge"),
        created: "2025-11-03T14:02:00Z",
    };
    ev.push(event(&mut ids, "IssuesEvent", mira, calc, json!({"action": "opened", "issue": issue(calc, 6,
        "mean() raises ZeroDivisionError on an empty list", "`mean([])` should return None, like `divide(x, 0)`.", mira, None, &["bug"])}),
        "2025-11-03T14:00:00Z"));
    ev.push(event(
        &mut ids,
        "PullRequestEvent",
        ravi,
        calc,
        json!({"action": "opened", "number": 7, "pull_request": pr_stub(&pr7, &calc.sha("pr7_first"))}),
        "2025-11-03T14:02:00Z",
    ));
    ev.push(event(&mut ids, "IssueCommentEvent", mira, calc, json!({"action": "created",
        "issue": issue(calc, 7, pr7.title, pr7.body, ravi, Some(None), &[]),
        "comment": {"id": 9001, "user": user("mira", 101, "User"), "body": "Can you add a test?", "created_at": "2025-11-03T14:10:00Z"}}),
        "2025-11-03T14:10:00Z"));
    ev.push(event(
        &mut ids,
        "PushEvent",
        ravi,
        calc,
        json!({"repository_id": calc.id, "push_id": 2, "ref": "refs/heads/fix-7",
        "head": calc.sha("pr7_head"), "before": calc.sha("pr7_first")}),
        "2025-11-03T14:20:00Z",
    ));
    ev.push(event(
        &mut ids,
        "PullRequestEvent",
        mira,
        calc,
        json!({"action": "merged", "number": 7, "pull_request": pr_stub(&pr7, &calc.sha("pr7_head"))}),
        "2025-11-03T14:30:00Z",
    ));
    let pr9 = Pr {
        repo: calc,
        number: 9,
        title: "",
        body: "",
        author: ("ravi", 103, "User"),
        head_ref: "fix-9",
        head: calc.sha("pr9_head"),
        base: calc.sha("pr7_merge"),
        created: "2025-11-03T14:35:00Z",
    };
    ev.push(event(
        &mut ids,
        "PullRequestEvent",
        ravi,
        calc,
        json!({"action": "closed", "number": 9, "pull_request": pr_stub(&pr9, &calc.sha("pr9_head"))}),
        "2025-11-03T14:40:00Z",
    ));
    let mut lines: Vec<String> = ev.iter().map(|e| e.to_string()).collect();
    // Damage the demo shows as rejections: a cut-off line and a pre-2015 Timeline event.
    let cut = lines[3].len() / 2;
    lines.insert(3, lines[3][..cut].to_string());
    lines.push(
        json!({"repository": {"name": "calc", "owner": "old"}, "actor": "someone", "type": "PushEvent",
               "created_at": "2012-03-10T22:34:47-08:00", "payload": {}, "public": true})
        .to_string(),
    );
    lines
}

/// The sample hour files, by file name, as bytes (gzip written without a timestamp).
pub fn hour_files(repos: &[SampleRepo]) -> Result<Vec<(String, Vec<u8>)>> {
    let calc = repos.iter().find(|r| r.name.ends_with("/calc")).context("calc repository")?;
    let textkit = repos.iter().find(|r| r.name.ends_with("/textkit")).context("textkit repository")?;
    let mut jan = String::new();
    for e in hour_2025_01_06(calc, textkit) {
        jan.push_str(&e.to_string());
        jan.push('\n');
    }
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    gz.write_all(jan.as_bytes())?;
    let mut nov = hour_2025_11_03(calc).join("\n");
    nov.push('\n');
    Ok(vec![("2025-01-06-10.json.gz".into(), gz.finish()?), ("2025-11-03-14.json".into(), nov.into_bytes())])
}

/// Writes the sample hours into `dir` (how `data-samples/gharchive/` is regenerated).
pub fn write_hours(dir: &Path, repos: &[SampleRepo]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for (name, bytes) in hour_files(repos)? {
        let p = dir.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        out.push(p);
    }
    Ok(out)
}
