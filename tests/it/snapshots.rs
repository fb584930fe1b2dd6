//! Snapshots from real git repositories made in the test (git2), checked against the git CLI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use git2::{Oid, Repository, Signature, Time};
use serde_json::json;
use swelake::git::Mirrors;
use swelake::ingest::run as ingest;
use swelake::jobs::{run, GitOptions, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::{count, pairs, quiet_ingest};

/// (path bytes, content) of the files below one directory.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A tree from (path bytes, content) entries, nested directories included.
fn tree(repo: &Repository, entries: &[(&[u8], &[u8])]) -> Oid {
    let mut dirs: std::collections::BTreeMap<Vec<u8>, Entries> = Default::default();
    let mut b = repo.treebuilder(None).unwrap();
    for (path, content) in entries {
        match path.iter().position(|c| *c == b'/') {
            Some(i) => dirs.entry(path[..i].to_vec()).or_default().push((path[i + 1..].to_vec(), content.to_vec())),
            None => {
                let blob = repo.blob(content).unwrap();
                b.insert(path.to_vec(), blob, 0o100644).unwrap();
            }
        }
    }
    for (dir, sub) in dirs {
        let refs: Vec<(&[u8], &[u8])> = sub.iter().map(|(p, c)| (p.as_slice(), c.as_slice())).collect();
        let t = tree(repo, &refs);
        b.insert(dir, t, 0o040000).unwrap();
    }
    b.write().unwrap()
}

fn commit(repo: &Repository, at: i64, msg: &str, entries: &[(&[u8], &[u8])], parents: &[Oid]) -> Oid {
    let sig = Signature::new("Tess Ter", "tess@example.org", &Time::new(at, 0)).unwrap();
    let t = repo.find_tree(tree(repo, entries)).unwrap();
    let ps: Vec<git2::Commit> = parents.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
    let refs: Vec<&git2::Commit> = ps.iter().collect();
    repo.commit(None, &sig, &sig, msg, &t, &refs).unwrap()
}

struct Made {
    base: Oid,
    head: Oid,
    merge: Oid,
}

const LONG: &[u8] = b"line one of a module that is long enough\nline two\nline three\nline four\nline five\nline six\n";

/// main: base commit; PR branch: rename with an edit, deletion, binary add, an edit of a file
/// with a non-UTF-8 name, a new nested file; then main moves on and merges the branch.
fn make_repo(dir: &Path) -> Made {
    let repo = Repository::init_bare(dir).unwrap();
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\x01\x02".iter().cycle().take(300).copied().collect();
    let base = commit(
        &repo,
        1_700_000_000,
        "base\n",
        &[
            (b"src/old_name.py", LONG),
            (b"src/gone.py", b"print('bye')\n"),
            (b"caf\xe9.txt", b"latin-1 named file\n"),
            (b"README.md", b"# test\n"),
        ],
        &[],
    );
    let mut renamed = LONG.to_vec();
    renamed.extend_from_slice(b"line seven added\n");
    let head = commit(
        &repo,
        1_700_000_100,
        "change things\n\nFixes #1\n",
        &[
            (b"src/new_name.py", &renamed),
            (b"caf\xe9.txt", b"latin-1 named file, edited\n"),
            (b"README.md", b"# test\n"),
            (b"img/pic.png", &png),
            (b"src/pkg/extra.rs", b"fn main() {}\n"),
        ],
        &[base],
    );
    // main moves on independently, then merges the PR.
    let side = commit(
        &repo,
        1_700_000_200,
        "docs\n",
        &[
            (b"src/old_name.py", LONG),
            (b"src/gone.py", b"print('bye')\n"),
            (b"caf\xe9.txt", b"latin-1 named file\n"),
            (b"README.md", b"# test\n\nMore docs.\n"),
        ],
        &[base],
    );
    let merge = commit(
        &repo,
        1_700_000_300,
        "Merge pull request #5\n",
        &[
            (b"src/new_name.py", &renamed),
            (b"caf\xe9.txt", b"latin-1 named file, edited\n"),
            (b"README.md", b"# test\n\nMore docs.\n"),
            (b"img/pic.png", &png),
            (b"src/pkg/extra.rs", b"fn main() {}\n"),
        ],
        &[side, head],
    );
    repo.reference("refs/heads/main", merge, true, "test").unwrap();
    repo.reference("refs/pull/5/head", head, true, "test").unwrap();
    Made { base: side, head, merge }
}

/// A merged-PR event of the Events API shape.
fn merged_pr(id: u64, repo: &str, number: i64, base: &str, head: &str, merge: &str) -> String {
    json!({"id": id.to_string(), "type": "PullRequestEvent", "actor": {"id": 1, "login": "tess"},
        "repo": {"id": 42, "name": repo}, "public": true, "created_at": "2025-02-01T10:00:00Z",
        "payload": {"action": "closed", "number": number, "pull_request": {
            "number": number, "title": format!("PR {number}"), "body": "No issue mentioned here.", "state": "closed", "merged": true,
            "merged_at": "2025-02-01T10:00:00Z", "merge_commit_sha": merge, "user": {"login": "tess", "type": "User"},
            "base": {"ref": "main", "sha": base, "repo": {"id": 42, "full_name": repo}},
            "head": {"ref": "feature", "sha": head, "repo": {"id": 42, "full_name": repo}}}}})
    .to_string()
}

/// `git diff --name-status -z -M` of the bare repository, as (status letter, path, old path).
fn git_name_status(repo: &Path, from: Oid, to: Oid) -> BTreeSet<(String, Vec<u8>, Option<Vec<u8>>)> {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(["diff", "--name-status", "-z", "-M", &from.to_string(), &to.to_string()])
        .output()
        .expect("git CLI");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut fields = out.stdout.split(|b| *b == 0).filter(|f| !f.is_empty());
    let mut set = BTreeSet::new();
    while let Some(status) = fields.next() {
        let letter = (status[0] as char).to_string();
        if letter == "R" || letter == "C" {
            let old = fields.next().unwrap().to_vec();
            let new = fields.next().unwrap().to_vec();
            set.insert((letter, new, Some(old)));
        } else {
            set.insert((letter, fields.next().unwrap().to_vec(), None));
        }
    }
    set
}

fn git_show(repo: &Path, spec: &str) -> Vec<u8> {
    let out = Command::new("git").arg("--git-dir").arg(repo).args(["show", spec]).output().unwrap();
    assert!(out.status.success());
    out.stdout
}

async fn run_snapshots(lake: &Lake, template: &str, cache: &Path) -> swelake::jobs::JobSummary {
    let registry = Registry::load(None, None).unwrap();
    let mut git = GitOptions::new(Mirrors::new(template, cache.to_path_buf()));
    git.max_blob_bytes = 200;
    let opts = RunOptions { all: true, git: Some(git), ..Default::default() };
    let all: Vec<String> = registry.jobs.keys().cloned().collect();
    run(lake, &registry, &all, &opts).await.unwrap().into_iter().find(|s| s.job == "snapshots").unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn pr_files_match_git_and_failures_are_rows_that_get_retried() {
    let dir = tempfile::tempdir().unwrap();
    let repos: PathBuf = dir.path().join("repos");
    let good = repos.join("acme/widget.git");
    let made = make_repo(&good);
    let mb = Repository::open_bare(&good).unwrap().merge_base(made.base, made.head).unwrap();

    // Three merged PRs: a good one, one whose head was force-pushed away, one in a
    // repository that cannot be reached.
    let ghost = "1234567890123456789012345678901234567890";
    let lines = [
        merged_pr(1, "acme/widget", 5, &made.base.to_string(), &made.head.to_string(), &made.merge.to_string()),
        merged_pr(2, "acme/widget", 6, &made.base.to_string(), ghost, ghost),
        merged_pr(3, "acme/elsewhere", 2, &made.base.to_string(), &made.head.to_string(), &made.merge.to_string()),
    ];
    let hour = dir.path().join("2025-02-01-10.json");
    std::fs::write(&hour, lines.join("\n") + "\n").unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    ingest(&lake, &quiet_ingest(&hour)).await.unwrap();
    let template = format!("{}/{{repo}}.git", repos.display());
    let cache = dir.path().join("mirrors");

    let s = run_snapshots(&lake, &template, &cache).await;
    assert_eq!(s.notes["prs_snapshotted"], 1, "{s:?}");
    assert_eq!(s.notes["failed:sha_not_found"], 1);
    assert_eq!(s.notes["failed:clone_failed"], 1);

    // pr_files agrees with `git diff --name-status -M <merge-base> <head>`.
    let want = git_name_status(&good, mb, made.head);
    let batches = swelake::sql::query(
        &lake,
        "SELECT status, coalesce(CAST(path_bytes AS BYTEA), CAST(path AS BYTEA)), CAST(old_path AS BYTEA) FROM pr_files WHERE pr_number = 5",
    )
    .await
    .unwrap();
    let mut got = BTreeSet::new();
    for b in &batches {
        use arrow::array::{Array, AsArray};
        let st = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        let p = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Binary).unwrap();
        let o = arrow::compute::cast(b.column(2), &arrow::datatypes::DataType::Binary).unwrap();
        let (st, p, o) = (st.as_string::<i32>(), p.as_binary::<i32>(), o.as_binary::<i32>());
        for r in 0..b.num_rows() {
            got.insert((st.value(r).to_string(), p.value(r).to_vec(), (!o.is_null(r)).then(|| o.value(r).to_vec())));
        }
    }
    assert_eq!(got, want);
    let statuses: BTreeSet<String> = want.iter().map(|w| w.0.clone()).collect();
    assert_eq!(statuses, ["A", "D", "M", "R"].iter().map(|s| s.to_string()).collect(), "the test covers every kind");

    // Contents by blob id equal what git shows at the merge base and the head.
    let rows = pairs(
        &lake,
        "SELECT concat(f.path, '|', b.content), CAST(b.size AS BIGINT) FROM pr_files f JOIN file_blobs b ON b.blob_sha = f.new_blob \
         WHERE f.path = 'src/new_name.py'",
    )
    .await;
    let head_text = git_show(&good, &format!("{}:src/new_name.py", made.head));
    assert_eq!(
        rows,
        vec![(format!("src/new_name.py|{}", String::from_utf8(head_text.clone()).unwrap()), head_text.len() as i64)]
    );
    let old = pairs(&lake, "SELECT b.content, b.size FROM pr_files f JOIN file_blobs b ON b.blob_sha = f.old_blob WHERE f.path = 'src/new_name.py'").await;
    assert_eq!(old[0].0.as_bytes(), git_show(&good, &format!("{mb}:src/old_name.py")).as_slice());
    // The binary file is flagged, and over the 200-byte cap its content is not stored.
    assert_eq!(
        count(&lake, "SELECT count(*) FROM pr_files WHERE path = 'img/pic.png' AND is_binary AND status = 'A'").await,
        1
    );
    assert_eq!(count(&lake, "SELECT count(*) FROM file_blobs WHERE is_binary AND NOT stored AND size = 300").await, 1);
    // The non-UTF-8 name is kept exactly in path_bytes.
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_files WHERE path_bytes IS NOT NULL").await, 1);
    // Each blob once.
    assert_eq!(
        count(&lake, "SELECT count(*) FROM file_blobs").await,
        count(&lake, "SELECT count(DISTINCT blob_sha) FROM file_blobs").await
    );
    // The PR's commit, with its message.
    assert_eq!(
        pairs(&lake, "SELECT sha, position FROM pr_commits WHERE pr_number = 5").await,
        vec![(made.head.to_string(), 0)]
    );
    // Failures are data.
    let errs = pairs(&lake, "SELECT reason, pr_number FROM snapshot_errors ORDER BY reason").await;
    assert_eq!(errs, vec![("clone_failed".to_string(), 2), ("sha_not_found".to_string(), 6)]);
    let files_before = count(&lake, "SELECT count(*) FROM pr_files").await;
    // The only mention of the issue is in the git commit message ("Fixes #1"): after the
    // snapshot, in the same run, the link is found there.
    let links = "SELECT concat(repo_name, '#', CAST(pr_number AS VARCHAR), ' ', source), issue_number FROM pr_issue_links ORDER BY 1";
    assert_eq!(pairs(&lake, links).await, vec![("acme/widget#5 commit_message".to_string(), 1)]);

    // The unreachable repository appears; a rerun retries only what failed.
    std::fs::create_dir_all(repos.join("acme")).unwrap();
    copy_dir(&good, &repos.join("acme/elsewhere.git"));
    let s = run_snapshots(&lake, &template, &cache).await;
    assert_eq!(s.notes["prs_already_done"], 1);
    assert_eq!(s.notes["prs_snapshotted"], 1);
    assert_eq!(s.notes["failed:sha_not_found"], 1, "still force-pushed away");
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_files").await, 2 * files_before);
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_snapshots WHERE status = 'ok'").await, 2);
    // No new events, but a new snapshot: the links job ran again for that PR.
    assert_eq!(
        pairs(&lake, links).await,
        vec![("acme/elsewhere#2 commit_message".to_string(), 1), ("acme/widget#5 commit_message".to_string(), 1)]
    );
    // Blobs shared with the first repository were not stored again.
    assert_eq!(
        count(&lake, "SELECT count(*) FROM file_blobs").await,
        count(&lake, "SELECT count(DISTINCT blob_sha) FROM file_blobs").await
    );

    // Nothing new: nothing written.
    let s = run_snapshots(&lake, &template, &cache).await;
    assert_eq!(s.notes["prs_snapshotted"], 0);
    assert_eq!(count(&lake, "SELECT count(*) FROM pr_files").await, 2 * files_before);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

#[test]
fn committed_sample_hours_are_what_the_generator_writes() {
    let dir = tempfile::tempdir().unwrap();
    let repos = swelake::samples::create_repos(dir.path()).unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    for (name, bytes) in swelake::samples::hour_files(&repos).unwrap() {
        let committed = std::fs::read(samples.join(&name)).unwrap();
        assert!(
            committed == bytes,
            "{name} differs from the generator: run `swelake samples --hours data-samples/gharchive`"
        );
    }
    // Every SHA the hours mention is a commit of a sample repository.
    let text = std::fs::read_to_string(samples.join("2025-11-03-14.json")).unwrap();
    let mut gz = flate2::read::MultiGzDecoder::new(std::fs::File::open(samples.join("2025-01-06-10.json.gz")).unwrap());
    let mut jan = String::new();
    std::io::Read::read_to_string(&mut gz, &mut jan).unwrap();
    let all = text + &jan;
    let shas: BTreeSet<String> = regex::Regex::new(r"[0-9a-f]{40}")
        .unwrap()
        .find_iter(&all)
        .map(|m| m.as_str().to_string())
        .filter(|s| s != "0000000000000000000000000000000000000000")
        .collect();
    assert!(shas.len() >= 10);
    for sha in &shas {
        let oid = Oid::from_str(sha).unwrap();
        assert!(repos.iter().any(|r| Repository::open_bare(&r.path).unwrap().find_commit(oid).is_ok()), "{sha}");
    }
}
