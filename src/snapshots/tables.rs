//! Rows of the snapshot tables and their record batches: `pr_files`, `pr_commits`,
//! `pr_snapshots` and `snapshot_errors`, written from their schema files by column name
//! ([`to_batch`]); `file_blobs` belongs to the lake's blob store.

use anyhow::Result;
use arrow::array::RecordBatch;
use serde::Serialize;

use super::{PR_COMMITS, PR_FILES, PR_SNAPSHOTS, SNAPSHOT_ERRORS};
use crate::lake::rows::{hex, to_batch};

/// Text as UTF-8 if it is, else a lossy rendering plus the exact bytes.
fn text_and_bytes(bytes: &[u8]) -> (String, Option<Vec<u8>>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_string(), None),
        Err(_) => (String::from_utf8_lossy(bytes).into_owned(), Some(bytes.to_vec())),
    }
}

#[derive(Debug, Clone)]
pub struct FileRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub path: Vec<u8>,
    pub old_path: Option<Vec<u8>>,
    pub status: char,
    pub old_blob: Option<String>,
    pub new_blob: Option<String>,
    pub old_mode: u32,
    pub new_mode: u32,
    pub additions: usize,
    pub deletions: usize,
    pub is_binary: bool,
    pub patch: Vec<u8>,
    pub merge_base: String,
    pub head_sha: String,
}

/// A row of `pr_files`.
#[derive(Serialize)]
struct PrFile<'a> {
    repo_name: &'a str,
    pr_number: i64,
    path: String,
    old_path: Option<String>,
    #[serde(serialize_with = "hex")]
    path_bytes: Option<Vec<u8>>,
    status: String,
    old_blob: Option<&'a str>,
    new_blob: Option<&'a str>,
    old_mode: i64,
    new_mode: i64,
    additions: i64,
    deletions: i64,
    is_binary: bool,
    language: Option<&'static str>,
    patch: String,
    #[serde(serialize_with = "hex")]
    patch_bytes: Option<Vec<u8>>,
    merge_base: &'a str,
    head_sha: &'a str,
}

pub fn files_batch(rows: &[FileRow]) -> Result<RecordBatch> {
    let rows: Vec<PrFile> = rows
        .iter()
        .map(|r| {
            let (path, path_bytes) = text_and_bytes(&r.path);
            let (patch, patch_bytes) = text_and_bytes(&r.patch);
            // A symlink or a submodule pointer is no code, whatever its name says; the mode
            // after the change decides (before it, for a deletion).
            let mode = if r.status == 'D' { r.old_mode } else { r.new_mode };
            let regular = crate::git::renames::is_regular(mode);
            PrFile {
                repo_name: &r.repo_name,
                pr_number: r.pr_number,
                language: if regular { crate::lang::language(&path) } else { None },
                path,
                old_path: r.old_path.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
                path_bytes,
                status: r.status.to_string(),
                old_blob: r.old_blob.as_deref(),
                new_blob: r.new_blob.as_deref(),
                old_mode: r.old_mode as i64,
                new_mode: r.new_mode as i64,
                additions: r.additions as i64,
                deletions: r.deletions as i64,
                is_binary: r.is_binary,
                patch,
                patch_bytes,
                merge_base: &r.merge_base,
                head_sha: &r.head_sha,
            }
        })
        .collect();
    to_batch(PR_FILES, &rows)
}

#[derive(Debug, Clone)]
pub struct CommitRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub position: usize,
    pub info: crate::git::CommitInfo,
}

/// A row of `pr_commits`.
#[derive(Serialize)]
struct PrCommit<'a> {
    repo_name: &'a str,
    pr_number: i64,
    position: i64,
    sha: String,
    author_name: &'a str,
    author_email: &'a str,
    /// Microseconds.
    authored_at: i64,
    committer_name: &'a str,
    committed_at: i64,
    message: &'a str,
    parents: i64,
}

pub fn commits_batch(rows: &[CommitRow]) -> Result<RecordBatch> {
    let rows: Vec<PrCommit> = rows
        .iter()
        .map(|r| PrCommit {
            repo_name: &r.repo_name,
            pr_number: r.pr_number,
            position: r.position as i64,
            sha: r.info.sha.to_string(),
            author_name: &r.info.author_name,
            author_email: &r.info.author_email,
            authored_at: r.info.authored_at * 1_000_000,
            committer_name: &r.info.committer_name,
            committed_at: r.info.committed_at * 1_000_000,
            message: &r.info.message,
            parents: r.info.parents as i64,
        })
        .collect();
    to_batch(PR_COMMITS, &rows)
}

#[derive(Debug, Clone)]
pub struct SnapshotRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub base_sha: String,
    pub head_sha: String,
    pub merge_base: Option<String>,
    pub files: usize,
    pub commits: usize,
    /// `None` when the snapshot succeeded.
    pub failure: Option<crate::git::GitFailure>,
}

/// A row of `pr_snapshots`.
#[derive(Serialize)]
struct PrSnapshot<'a> {
    repo_name: &'a str,
    pr_number: i64,
    status: &'static str,
    base_sha: &'a str,
    head_sha: &'a str,
    merge_base: Option<&'a str>,
    files: i64,
    commits: i64,
    reason: Option<&'static str>,
    message: Option<&'a str>,
    snapshotted_at: i64,
}

pub fn snapshots_batch(rows: &[SnapshotRow], now_micros: i64) -> Result<RecordBatch> {
    let rows: Vec<PrSnapshot> = rows
        .iter()
        .map(|r| PrSnapshot {
            repo_name: &r.repo_name,
            pr_number: r.pr_number,
            status: if r.failure.is_some() { "error" } else { "ok" },
            base_sha: &r.base_sha,
            head_sha: &r.head_sha,
            merge_base: r.merge_base.as_deref(),
            files: r.files as i64,
            commits: r.commits as i64,
            reason: r.failure.as_ref().map(|f| f.reason),
            message: r.failure.as_ref().map(|f| f.message.as_str()),
            snapshotted_at: now_micros,
        })
        .collect();
    to_batch(PR_SNAPSHOTS, &rows)
}

/// A row of `snapshot_errors`.
#[derive(Serialize)]
struct SnapshotError<'a> {
    repo_name: &'a str,
    pr_number: i64,
    reason: &'static str,
    message: &'a str,
    occurred_at: i64,
}

pub fn errors_batch(rows: &[SnapshotRow], now_micros: i64) -> Result<RecordBatch> {
    let rows: Vec<SnapshotError> = rows
        .iter()
        .filter_map(|r| {
            let f = r.failure.as_ref()?;
            Some(SnapshotError {
                repo_name: &r.repo_name,
                pr_number: r.pr_number,
                reason: f.reason,
                message: &f.message,
                occurred_at: now_micros,
            })
        })
        .collect();
    to_batch(SNAPSHOT_ERRORS, &rows)
}
