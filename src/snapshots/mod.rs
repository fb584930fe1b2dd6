//! File snapshots from git: for every merged PR in scope, the files it changed with their
//! content before (at the merge base) and after (at the head), the per-file patch, and the
//! PR's commits.
//!
//! Input: `pull_requests` (merged, with base and head SHAs). Output: `pr_files` (one row per
//! changed file, contents by blob id), `file_blobs` (each blob once, content-addressed),
//! `pr_commits`, `pr_snapshots` (the state of every PR attempted: ok or error, which is the
//! watermark), and `snapshot_errors` (every failed attempt). A repository that cannot be
//! cloned, a SHA that no longer exists (force-push) or a corrupt object fails that PR or
//! repository only; a rerun retries exactly what is not `ok`.
//!
//! Not here: how git is read (`crate::git`), the blob store (`crate::lake::blobs`).

pub(crate) mod tables;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::git::{self, GitFailure, Mirrors};
use crate::lake::blobs::{self, BlobRow};
use crate::lake::runs::{self, RunRecord};
use crate::lake::Lake;
use crate::stage::{JobSummary, Need, Stage, StageCtx, Unit};
use tables::{CommitRow, FileRow, SnapshotRow};

pub const PR_FILES: &str = "pr_files";
pub const PR_COMMITS: &str = "pr_commits";
pub const PR_SNAPSHOTS: &str = "pr_snapshots";
pub const SNAPSHOT_ERRORS: &str = "snapshot_errors";
/// The snapshots stage: a repository at a time, with the blob store's `file_blobs`.
pub struct Snapshots;

#[async_trait::async_trait(?Send)]
impl Stage for Snapshots {
    fn name(&self) -> &'static str {
        "snapshots"
    }

    fn description(&self) -> &'static str {
        "Files changed by every merged PR, with contents at the merge base and head, patches and commits, read from git."
    }

    fn inputs(&self) -> &'static [&'static str] {
        &["pull_requests"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[PR_FILES, blobs::FILE_BLOBS, PR_COMMITS, PR_SNAPSHOTS, SNAPSHOT_ERRORS]
    }

    /// pr_snapshots holds the state of every PR (ok or error), so a rerun does exactly the
    /// PRs that are not ok yet.
    fn unit(&self) -> Unit {
        Unit::Column("repo_name")
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["pull_requests"]
    }

    fn needs(&self) -> &'static [Need] {
        &[Need::Repositories]
    }

    async fn run(&self, lake: &Lake, ctx: &StageCtx<'_>) -> Result<JobSummary> {
        let max_blob_bytes = ctx.git.map_or(1 << 20, |g| g.max_blob_bytes);
        let opts = SnapshotOptions { scope: ctx.scope()?, max_blob_bytes };
        Ok(JobSummary::from(run(lake, &opts).await?))
    }
}

impl From<SnapshotSummary> for JobSummary {
    fn from(s: SnapshotSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_snapshotted".to_string(), s.prs_snapshotted as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("prs_failed".to_string(), s.prs_failed as i64),
            ("files".to_string(), s.files as i64),
            ("new_blobs".to_string(), s.new_blobs as i64),
        ]);
        for (reason, n) in &s.failures_by_reason {
            notes.insert(format!("failed:{reason}"), *n as i64);
        }
        let mut partitions = s.repos_processed.clone();
        partitions.sort();
        JobSummary { partitions, rows_out: s.files as u64, notes, ..Default::default() }
    }
}

/// Settings of a snapshot run.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// The repositories (`force`: snapshot again PRs that are already `ok`; `threads`:
    /// repositories at once).
    pub scope: crate::git::Scope,
    /// Blobs larger than this are recorded (size, binary flag) without their content.
    pub max_blob_bytes: usize,
}

impl SnapshotOptions {
    pub fn new(repo_url: impl Into<String>, cache_dir: std::path::PathBuf) -> Self {
        let scope =
            crate::git::Scope { show_progress: true, ..crate::git::Scope::new(Mirrors::new(repo_url, cache_dir)) };
        SnapshotOptions { scope, max_blob_bytes: 1 << 20 }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SnapshotSummary {
    pub repos: usize,
    /// Repositories that had PRs to snapshot in this run.
    pub repos_processed: Vec<String>,
    pub prs_in_scope: usize,
    pub prs_already_done: usize,
    pub prs_snapshotted: usize,
    pub prs_failed: usize,
    pub failures_by_reason: BTreeMap<String, usize>,
    pub files: usize,
    pub commits: usize,
    pub new_blobs: usize,
    pub new_blob_bytes: u64,
}

/// A merged PR to snapshot.
#[derive(Debug, Clone, Deserialize)]
struct PrRef {
    repo_name: String,
    number: i64,
    base_sha: String,
    head_sha: String,
}

/// Everything learned from one repository.
#[derive(Default)]
struct RepoResult {
    repo: String,
    files: Vec<FileRow>,
    commits: Vec<CommitRow>,
    blobs: Vec<BlobRow>,
    snapshots: Vec<SnapshotRow>,
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Snapshots every merged PR in scope that is not snapshotted yet.
pub async fn run(lake: &Lake, opts: &SnapshotOptions) -> Result<SnapshotSummary> {
    let mut summary = SnapshotSummary::default();
    if !lake.has_table("pull_requests").await? {
        anyhow::bail!("no pull_requests table yet: run the pull_requests job first");
    }
    let ctx = lake.session().await?;
    let scope = match &opts.scope.repos {
        Some(r) if !r.is_empty() => {
            format!(" AND repo_name IN ({})", r.iter().map(|x| quote(x)).collect::<Vec<_>>().join(", "))
        }
        _ => String::new(),
    };
    let prs: Vec<PrRef> = crate::query::rows(
        &ctx,
        &format!(
            "SELECT repo_name, number, base_sha, head_sha FROM pull_requests \
             WHERE merged AND base_sha IS NOT NULL AND head_sha IS NOT NULL{scope} ORDER BY repo_name, number"
        ),
    )
    .await?;
    let prs: Vec<PrRef> = match opts.scope.shard {
        Some(s) => prs.into_iter().filter(|p| s.owns(&p.repo_name)).collect(),
        None => prs,
    };
    summary.prs_in_scope = prs.len();
    // What the session registered, not what the lake holds now: a shard worker beside this
    // one may create the table after the session was opened.
    let ok: Vec<PrRef> = if ctx.table_exist(PR_SNAPSHOTS)? {
        crate::query::rows(
            &ctx,
            &format!(
                "SELECT repo_name, pr_number AS number, base_sha, head_sha FROM {PR_SNAPSHOTS} WHERE status = 'ok'"
            ),
        )
        .await?
    } else {
        Vec::new()
    };
    // Done: snapshotted with the SHAs the PR has now. A PR done again loses its old rows first
    // (see `write_repo`).
    let done: HashSet<(&str, i64, &str, &str)> = if opts.scope.force {
        HashSet::new()
    } else {
        ok.iter().map(|p| (p.repo_name.as_str(), p.number, p.base_sha.as_str(), p.head_sha.as_str())).collect()
    };
    let mut by_repo: BTreeMap<String, Vec<PrRef>> = BTreeMap::new();
    for p in prs {
        if done.contains(&(p.repo_name.as_str(), p.number, p.base_sha.as_str(), p.head_sha.as_str())) {
            summary.prs_already_done += 1;
            continue;
        }
        by_repo.entry(p.repo_name.clone()).or_default().push(p);
    }
    summary.repos = by_repo.len();
    let known: HashSet<git2::Oid> =
        blobs::known(lake).await?.iter().filter_map(|s| git2::Oid::from_str(s).ok()).collect();
    let known = Arc::new(Mutex::new(known));

    let mp = crate::progress::multi(opts.scope.show_progress);
    let bar = mp.add(crate::progress::count_bar(by_repo.len() as u64, "repositories"));
    let mut stream = futures::stream::iter(by_repo.into_iter().map(|(repo, prs)| {
        let opts = opts.clone();
        let known = known.clone();
        async move {
            tokio::task::spawn_blocking(move || snapshot_repo(&repo, &prs, &opts, &known))
                .await
                .context("a snapshot worker panicked")
        }
    }))
    .buffer_unordered(opts.scope.threads.max(1));
    while let Some(result) = stream.next().await {
        let r = result?;
        write_repo(lake, &r, &mut summary).await.with_context(|| format!("writing snapshots of {}", r.repo))?;
        summary.repos_processed.push(r.repo.clone());
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(summary)
}

/// Reads everything about the PRs of one repository (blocking: libgit2).
fn snapshot_repo(
    repo_name: &str,
    prs: &[PrRef],
    opts: &SnapshotOptions,
    known: &Mutex<HashSet<git2::Oid>>,
) -> RepoResult {
    let mut out = RepoResult { repo: repo_name.to_string(), ..Default::default() };
    let fail_all = |out: &mut RepoResult, f: GitFailure| {
        for p in prs {
            out.snapshots.push(SnapshotRow {
                repo_name: repo_name.to_string(),
                pr_number: p.number,
                base_sha: p.base_sha.clone(),
                head_sha: p.head_sha.clone(),
                merge_base: None,
                files: 0,
                commits: 0,
                failure: Some(f.clone()),
            });
        }
    };
    let url = opts.scope.mirrors.url(repo_name);
    let repo = match opts.scope.mirrors.open(repo_name) {
        Ok(r) => r,
        Err(f) => {
            fail_all(&mut out, f);
            return out;
        }
    };
    // Fetch once for every missing commit of the repository's PRs.
    let mut wanted = Vec::new();
    for p in prs {
        for s in [&p.base_sha, &p.head_sha] {
            if let Ok(o) = git::oid(s) {
                wanted.push(o);
            }
        }
    }
    let numbers: Vec<i64> = prs.iter().map(|p| p.number).collect();
    let missing: HashSet<git2::Oid> = git::ensure_commits(&repo, &url, &wanted, &numbers).into_iter().collect();
    for p in prs {
        match snapshot_pr(&repo, repo_name, p, &missing, opts, known) {
            Ok((files, commits, blobs, mb)) => {
                out.snapshots.push(SnapshotRow {
                    repo_name: repo_name.to_string(),
                    pr_number: p.number,
                    base_sha: p.base_sha.clone(),
                    head_sha: p.head_sha.clone(),
                    merge_base: Some(mb),
                    files: files.len(),
                    commits: commits.len(),
                    failure: None,
                });
                out.files.extend(files);
                out.commits.extend(commits);
                out.blobs.extend(blobs);
            }
            Err(f) => out.snapshots.push(SnapshotRow {
                repo_name: repo_name.to_string(),
                pr_number: p.number,
                base_sha: p.base_sha.clone(),
                head_sha: p.head_sha.clone(),
                merge_base: None,
                files: 0,
                commits: 0,
                failure: Some(f),
            }),
        }
    }
    out
}

type PrSnapshot = (Vec<FileRow>, Vec<CommitRow>, Vec<BlobRow>, String);

fn snapshot_pr(
    repo: &git2::Repository,
    repo_name: &str,
    p: &PrRef,
    missing: &HashSet<git2::Oid>,
    opts: &SnapshotOptions,
    known: &Mutex<HashSet<git2::Oid>>,
) -> Result<PrSnapshot, GitFailure> {
    let (base, head) = (git::oid(&p.base_sha)?, git::oid(&p.head_sha)?);
    for (what, o) in [("base", base), ("head", head)] {
        if missing.contains(&o) {
            return Err(GitFailure {
                reason: "sha_not_found",
                message: format!("{what} commit {o} is not in the repository (force-pushed or deleted?)"),
            });
        }
    }
    let (mb, changes) = git::pr_changes(repo, base, head)?;
    let commits = git::pr_commits(repo, base, head)?;
    let mut blobs = Vec::new();
    for c in &changes {
        for oid in [c.old_blob, c.new_blob].into_iter().flatten() {
            // Each blob is read once per lake: skip what is stored or taken by another PR.
            if !known.lock().expect("blob set lock").insert(oid) {
                continue;
            }
            let size = git::blob_size(repo, oid)?;
            let (content, is_binary) = if size <= opts.max_blob_bytes {
                let (bytes, bin) = git::read_blob(repo, oid)?;
                (Some(bytes), bin)
            } else {
                (None, git::blob_is_binary(repo, oid)?)
            };
            blobs.push(BlobRow { sha: oid.to_string(), size, is_binary, content });
        }
    }
    let files = changes
        .into_iter()
        .map(|c| FileRow {
            repo_name: repo_name.to_string(),
            pr_number: p.number,
            path: c.path,
            old_path: c.old_path,
            status: c.status,
            old_blob: c.old_blob.map(|o| o.to_string()),
            new_blob: c.new_blob.map(|o| o.to_string()),
            old_mode: c.old_mode,
            new_mode: c.new_mode,
            additions: c.additions,
            deletions: c.deletions,
            is_binary: c.is_binary,
            patch: c.patch,
            merge_base: mb.to_string(),
            head_sha: p.head_sha.clone(),
        })
        .collect();
    let commits = commits
        .into_iter()
        .enumerate()
        .map(|(i, info)| CommitRow { repo_name: repo_name.to_string(), pr_number: p.number, position: i, info })
        .collect();
    Ok((files, commits, blobs, mb.to_string()))
}

fn repo_key(repo: &str) -> String {
    repo.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

async fn write_repo(lake: &Lake, r: &RepoResult, s: &mut SnapshotSummary) -> Result<()> {
    let now = chrono::Utc::now().timestamp_micros();
    let ok: Vec<&SnapshotRow> = r.snapshots.iter().filter(|x| x.failure.is_none()).collect();
    // Every PR written here loses its old rows first: those snapshotted before (their SHAs
    // changed, or --force), and those of a run that died after writing `pr_files` but before
    // `pr_snapshots` said they were done. Until `pr_snapshots` does, a PR is not `ok`, so a run
    // that stops anywhere in between is redone by the next.
    let redo: Vec<String> = ok.iter().map(|x| x.pr_number.to_string()).collect();
    if !redo.is_empty() {
        let pred = format!("repo_name = {} AND pr_number IN ({})", quote(&r.repo), redo.join(", "));
        lake.delete_where(PR_FILES, &pred).await?;
        lake.delete_where(PR_COMMITS, &pred).await?;
    }
    // The worker took these blobs from the shared set of known ones: they are new to the store.
    blobs::append_new(lake, &r.blobs).await?;
    lake.append_staged(PR_FILES, &tables::files_batch(&r.files)?, &["patch", "patch_bytes"]).await?;
    lake.append_staged(PR_COMMITS, &tables::commits_batch(&r.commits)?, &["message", "sha"]).await?;
    lake.append_staged(SNAPSHOT_ERRORS, &tables::errors_batch(&r.snapshots, now)?, &["message"]).await?;
    let snaps = tables::snapshots_batch(&r.snapshots, now)?;
    if snaps.num_rows() > 0 {
        let keys = ["repo_name".to_string(), "pr_number".to_string()];
        lake.upsert_rows(PR_SNAPSHOTS, &snaps.schema(), &[snaps], &keys, None, &repo_key(&r.repo)).await?;
    }

    let failed: Vec<&SnapshotRow> = r.snapshots.iter().filter(|x| x.failure.is_some()).collect();
    for f in &failed {
        *s.failures_by_reason.entry(f.failure.as_ref().expect("filtered").reason.to_string()).or_default() += 1;
        tracing::warn!(repo = %f.repo_name, pr = f.pr_number, reason = f.failure.as_ref().expect("filtered").reason, "snapshot failed");
    }
    s.prs_snapshotted += ok.len();
    s.prs_failed += failed.len();
    s.files += r.files.len();
    s.commits += r.commits.len();
    s.new_blobs += r.blobs.len();
    s.new_blob_bytes += r.blobs.iter().map(|b| b.content.as_ref().map_or(0, |c| c.len() as u64)).sum::<u64>();
    let detail = serde_json::json!({"prs": r.snapshots.len(), "failed": failed.len(), "files": r.files.len(), "new_blobs": r.blobs.len()});
    let mut rec = RunRecord::ok(
        "snapshots",
        &repo_key(&r.repo),
        r.snapshots.len() as u64,
        ok.len() as u64,
        failed.len() as u64,
        None,
        detail,
    );
    if ok.is_empty() && !failed.is_empty() {
        rec.status = "failed".into();
    }
    runs::record(lake, rec).await
}
