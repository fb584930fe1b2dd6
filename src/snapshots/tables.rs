//! Rows of the snapshot tables and their record batches: `pr_files`, `pr_commits`,
//! `pr_snapshots` and `snapshot_errors`, in the layouts of their schema files (`file_blobs`
//! belongs to the lake's blob store).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};

use super::{PR_COMMITS, PR_FILES, PR_SNAPSHOTS, SNAPSHOT_ERRORS};
use crate::schema;

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

pub fn files_batch(rows: &[FileRow]) -> RecordBatch {
    let (mut repo, mut num, mut path, mut old, mut pbytes) =
        (StringBuilder::new(), Int64Builder::new(), StringBuilder::new(), StringBuilder::new(), BinaryBuilder::new());
    let (mut status, mut ob, mut nb, mut om, mut nm) =
        (StringBuilder::new(), StringBuilder::new(), StringBuilder::new(), Int64Builder::new(), Int64Builder::new());
    let (mut add, mut del, mut bin, mut lang, mut patch, mut patch_bytes, mut mb, mut head) = (
        Int64Builder::new(),
        Int64Builder::new(),
        BooleanBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        BinaryBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    for r in rows {
        repo.append_value(&r.repo_name);
        num.append_value(r.pr_number);
        let (p, raw) = text_and_bytes(&r.path);
        path.append_value(&p);
        pbytes.append_option(raw);
        old.append_option(r.old_path.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()));
        status.append_value(r.status.to_string());
        ob.append_option(r.old_blob.as_deref());
        nb.append_option(r.new_blob.as_deref());
        om.append_value(r.old_mode as i64);
        nm.append_value(r.new_mode as i64);
        add.append_value(r.additions as i64);
        del.append_value(r.deletions as i64);
        bin.append_value(r.is_binary);
        // A symlink or a submodule pointer is no code, whatever its name says; the mode after
        // the change decides (before it, for a deletion).
        let mode = if r.status == 'D' { r.old_mode } else { r.new_mode };
        let regular = crate::git::renames::is_regular(mode);
        lang.append_option(if regular { crate::lang::language(&p) } else { None });
        let (t, raw) = text_and_bytes(&r.patch);
        patch.append_value(t);
        patch_bytes.append_option(raw);
        mb.append_value(&r.merge_base);
        head.append_value(&r.head_sha);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(repo.finish()),
        Arc::new(num.finish()),
        Arc::new(path.finish()),
        Arc::new(old.finish()),
        Arc::new(pbytes.finish()),
        Arc::new(status.finish()),
        Arc::new(ob.finish()),
        Arc::new(nb.finish()),
        Arc::new(om.finish()),
        Arc::new(nm.finish()),
        Arc::new(add.finish()),
        Arc::new(del.finish()),
        Arc::new(bin.finish()),
        Arc::new(lang.finish()),
        Arc::new(patch.finish()),
        Arc::new(patch_bytes.finish()),
        Arc::new(mb.finish()),
        Arc::new(head.finish()),
    ];
    RecordBatch::try_new(schema::builtin(PR_FILES), cols).expect("rows follow the schema file of PR_FILES")
}

#[derive(Debug, Clone)]
pub struct CommitRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub position: usize,
    pub info: crate::git::CommitInfo,
}

pub fn commits_batch(rows: &[CommitRow]) -> RecordBatch {
    let mut s: Vec<StringBuilder> = (0..6).map(|_| StringBuilder::new()).collect();
    let (mut num, mut pos, mut parents) = (Int64Builder::new(), Int64Builder::new(), Int64Builder::new());
    let mut t: Vec<TimestampMicrosecondBuilder> =
        (0..2).map(|_| TimestampMicrosecondBuilder::new().with_timezone("UTC")).collect();
    for r in rows {
        s[0].append_value(&r.repo_name);
        num.append_value(r.pr_number);
        pos.append_value(r.position as i64);
        s[1].append_value(r.info.sha.to_string());
        s[2].append_value(&r.info.author_name);
        s[3].append_value(&r.info.author_email);
        t[0].append_value(r.info.authored_at * 1_000_000);
        s[4].append_value(&r.info.committer_name);
        t[1].append_value(r.info.committed_at * 1_000_000);
        s[5].append_value(&r.info.message);
        parents.append_value(r.info.parents as i64);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(s[0].finish()),
        Arc::new(num.finish()),
        Arc::new(pos.finish()),
        Arc::new(s[1].finish()),
        Arc::new(s[2].finish()),
        Arc::new(s[3].finish()),
        Arc::new(t[0].finish()),
        Arc::new(s[4].finish()),
        Arc::new(t[1].finish()),
        Arc::new(s[5].finish()),
        Arc::new(parents.finish()),
    ];
    RecordBatch::try_new(schema::builtin(PR_COMMITS), cols).expect("rows follow the schema file of PR_COMMITS")
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

pub fn snapshots_batch(rows: &[SnapshotRow], now_micros: i64) -> RecordBatch {
    let mut s: Vec<StringBuilder> = (0..7).map(|_| StringBuilder::new()).collect();
    let (mut num, mut files, mut commits) = (Int64Builder::new(), Int64Builder::new(), Int64Builder::new());
    let mut at = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    for r in rows {
        s[0].append_value(&r.repo_name);
        num.append_value(r.pr_number);
        s[1].append_value(if r.failure.is_some() { "error" } else { "ok" });
        s[2].append_value(&r.base_sha);
        s[3].append_value(&r.head_sha);
        s[4].append_option(r.merge_base.as_deref());
        files.append_value(r.files as i64);
        commits.append_value(r.commits as i64);
        s[5].append_option(r.failure.as_ref().map(|f| f.reason));
        s[6].append_option(r.failure.as_ref().map(|f| f.message.as_str()));
        at.append_value(now_micros);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(s[0].finish()),
        Arc::new(num.finish()),
        Arc::new(s[1].finish()),
        Arc::new(s[2].finish()),
        Arc::new(s[3].finish()),
        Arc::new(s[4].finish()),
        Arc::new(files.finish()),
        Arc::new(commits.finish()),
        Arc::new(s[5].finish()),
        Arc::new(s[6].finish()),
        Arc::new(at.finish()),
    ];
    RecordBatch::try_new(schema::builtin(PR_SNAPSHOTS), cols).expect("rows follow the schema file of PR_SNAPSHOTS")
}

pub fn errors_batch(rows: &[SnapshotRow], now_micros: i64) -> RecordBatch {
    let (mut repo, mut num, mut reason, mut msg) =
        (StringBuilder::new(), Int64Builder::new(), StringBuilder::new(), StringBuilder::new());
    let mut at = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    for r in rows {
        let Some(f) = &r.failure else { continue };
        repo.append_value(&r.repo_name);
        num.append_value(r.pr_number);
        reason.append_value(f.reason);
        msg.append_value(&f.message);
        at.append_value(now_micros);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(repo.finish()),
        Arc::new(num.finish()),
        Arc::new(reason.finish()),
        Arc::new(msg.finish()),
        Arc::new(at.finish()),
    ];
    RecordBatch::try_new(schema::builtin(SNAPSHOT_ERRORS), cols)
        .expect("rows follow the schema file of SNAPSHOT_ERRORS")
}
