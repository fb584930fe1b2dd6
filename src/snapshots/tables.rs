//! Rows and Arrow schemas of the snapshot tables: `pr_files`, `file_blobs`, `pr_commits`,
//! `pr_snapshots` and `snapshot_errors` (contracts in `schemas/*.toml`).

use std::sync::{Arc, LazyLock};

use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn f(name: &str, t: DataType, nullable: bool) -> Field {
    Field::new(name, t, nullable)
}

pub static PR_FILES: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::*;
    Arc::new(Schema::new(vec![
        f("repo_name", Utf8, false),
        f("pr_number", Int64, false),
        f("path", Utf8, false),
        f("old_path", Utf8, true),
        f("path_bytes", Binary, true),
        f("status", Utf8, false),
        f("old_blob", Utf8, true),
        f("new_blob", Utf8, true),
        f("old_mode", Int64, false),
        f("new_mode", Int64, false),
        f("additions", Int64, false),
        f("deletions", Int64, false),
        f("is_binary", Boolean, false),
        f("language", Utf8, true),
        f("patch", Utf8, false),
        f("patch_bytes", Binary, true),
        f("merge_base", Utf8, false),
        f("head_sha", Utf8, false),
    ]))
});

pub static FILE_BLOBS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::*;
    Arc::new(Schema::new(vec![
        f("blob_sha", Utf8, false),
        f("size", Int64, false),
        f("is_binary", Boolean, false),
        f("is_utf8", Boolean, false),
        f("stored", Boolean, false),
        f("content", Utf8, true),
        f("content_bytes", Binary, true),
    ]))
});

pub static PR_COMMITS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::*;
    Arc::new(Schema::new(vec![
        f("repo_name", Utf8, false),
        f("pr_number", Int64, false),
        f("position", Int64, false),
        f("sha", Utf8, false),
        f("author_name", Utf8, false),
        f("author_email", Utf8, false),
        f("authored_at", ts(), false),
        f("committer_name", Utf8, false),
        f("committed_at", ts(), false),
        f("message", Utf8, false),
        f("parents", Int64, false),
    ]))
});

pub static PR_SNAPSHOTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::*;
    Arc::new(Schema::new(vec![
        f("repo_name", Utf8, false),
        f("pr_number", Int64, false),
        f("status", Utf8, false),
        f("base_sha", Utf8, false),
        f("head_sha", Utf8, false),
        f("merge_base", Utf8, true),
        f("files", Int64, false),
        f("commits", Int64, false),
        f("reason", Utf8, true),
        f("message", Utf8, true),
        f("snapshotted_at", ts(), false),
    ]))
});

pub static SNAPSHOT_ERRORS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::*;
    Arc::new(Schema::new(vec![
        f("repo_name", Utf8, false),
        f("pr_number", Int64, true),
        f("reason", Utf8, false),
        f("message", Utf8, false),
        f("occurred_at", ts(), false),
    ]))
});

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
        lang.append_option(super::lang::language(&p));
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
    RecordBatch::try_new(PR_FILES.clone(), cols).expect("rows follow PR_FILES")
}

#[derive(Debug, Clone)]
pub struct BlobRow {
    pub sha: String,
    pub size: usize,
    pub is_binary: bool,
    /// The bytes, when under the size cap.
    pub content: Option<Vec<u8>>,
}

pub fn blobs_batch(rows: &[BlobRow]) -> RecordBatch {
    let (mut sha, mut size, mut bin, mut utf8, mut stored, mut text, mut bytes) = (
        StringBuilder::new(),
        Int64Builder::new(),
        BooleanBuilder::new(),
        BooleanBuilder::new(),
        BooleanBuilder::new(),
        StringBuilder::new(),
        BinaryBuilder::new(),
    );
    for r in rows {
        sha.append_value(&r.sha);
        size.append_value(r.size as i64);
        bin.append_value(r.is_binary);
        stored.append_value(r.content.is_some());
        match &r.content {
            Some(c) => match std::str::from_utf8(c) {
                Ok(s) if !r.is_binary => {
                    utf8.append_value(true);
                    text.append_value(s);
                    bytes.append_null();
                }
                Ok(_) => {
                    utf8.append_value(true);
                    text.append_null();
                    bytes.append_value(c);
                }
                Err(_) => {
                    utf8.append_value(false);
                    text.append_null();
                    bytes.append_value(c);
                }
            },
            None => {
                // Not read (over the cap): unknown, reported as not UTF-8.
                utf8.append_value(false);
                text.append_null();
                bytes.append_null();
            }
        }
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(sha.finish()),
        Arc::new(size.finish()),
        Arc::new(bin.finish()),
        Arc::new(utf8.finish()),
        Arc::new(stored.finish()),
        Arc::new(text.finish()),
        Arc::new(bytes.finish()),
    ];
    RecordBatch::try_new(FILE_BLOBS.clone(), cols).expect("rows follow FILE_BLOBS")
}

#[derive(Debug, Clone)]
pub struct CommitRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub position: usize,
    pub info: super::git::CommitInfo,
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
    RecordBatch::try_new(PR_COMMITS.clone(), cols).expect("rows follow PR_COMMITS")
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
    pub failure: Option<super::git::GitFailure>,
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
    RecordBatch::try_new(PR_SNAPSHOTS.clone(), cols).expect("rows follow PR_SNAPSHOTS")
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
    RecordBatch::try_new(SNAPSHOT_ERRORS.clone(), cols).expect("rows follow SNAPSHOT_ERRORS")
}
