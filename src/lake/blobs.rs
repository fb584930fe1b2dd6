//! `file_blobs`: the lake's content-addressed store of file contents, one row per git blob,
//! written by every stage that needs a file's content later (snapshots for the files a PR
//! changed, relevance for the files it ranks) and read by the seed. A blob is the same
//! wherever it appears, so writers only ever add blobs the store does not have yet.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, BinaryBuilder, BooleanBuilder, Int64Builder, RecordBatch, StringBuilder};

use crate::lake::Lake;

pub const FILE_BLOBS: &str = "file_blobs";

/// Columns of mostly unique long values (no dictionary, no statistics).
const LONG_TEXT: &[&str] = &["content", "content_bytes", "blob_sha"];

/// One blob: its id, size, git's binary verdict and (under the size cap) its bytes.
#[derive(Debug, Clone)]
pub struct BlobRow {
    pub sha: String,
    pub size: usize,
    pub is_binary: bool,
    /// The bytes, when under the size cap.
    pub content: Option<Vec<u8>>,
}

/// The rows as a batch of `file_blobs`.
pub fn batch(rows: &[BlobRow]) -> RecordBatch {
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
    RecordBatch::try_new(crate::schema::builtin(FILE_BLOBS), cols).expect("rows follow schemas/file_blobs.toml")
}

/// Ids of every blob in the store.
pub async fn known(lake: &Lake) -> Result<HashSet<String>> {
    if !lake.has_table(FILE_BLOBS).await? {
        return Ok(HashSet::new());
    }
    let ctx = lake.session().await?;
    Ok(crate::query::rows::<String>(&ctx, &format!("SELECT blob_sha FROM {FILE_BLOBS}")).await?.into_iter().collect())
}

/// Adds the blobs of `rows` that the store does not have (each once); returns how many. The
/// check is made at commit time (see [`Lake::insert_absent`]), so workers of different shards
/// that meet the same blob store it once.
pub async fn insert_absent(lake: &Lake, mut rows: Vec<BlobRow>) -> Result<usize> {
    let mut seen = HashSet::new();
    rows.retain(|b| seen.insert(b.sha.clone()));
    lake.insert_absent(FILE_BLOBS, &batch(&rows), &["blob_sha"], None, LONG_TEXT).await
}

/// Appends blobs the caller believes the store lacks: ids it took from a set that [`known`]
/// started, so that parallel workers of one process never read the same blob twice. Another
/// process may have stored some since; the commit-time check drops those.
pub async fn append_new(lake: &Lake, rows: &[BlobRow]) -> Result<()> {
    lake.insert_absent(FILE_BLOBS, &batch(rows), &["blob_sha"], None, LONG_TEXT).await?;
    Ok(())
}
