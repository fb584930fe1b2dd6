//! `file_blobs`: the lake's content-addressed store of file contents, one row per git blob,
//! written by every stage that needs a file's content later (snapshots for the files a PR
//! changed, relevance for the files it ranks) and read by the seed. A blob is the same
//! wherever it appears, so writers only ever add blobs the store does not have yet.

use std::collections::HashSet;

use anyhow::Result;
use arrow::array::RecordBatch;
use serde::Serialize;

use crate::lake::rows::{hex, to_batch};
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

/// A row of `file_blobs`.
#[derive(Serialize)]
struct StoredBlob<'a> {
    blob_sha: &'a str,
    size: i64,
    is_binary: bool,
    is_utf8: bool,
    stored: bool,
    content: Option<&'a str>,
    #[serde(serialize_with = "hex")]
    content_bytes: Option<Vec<u8>>,
}

/// The rows as a batch of `file_blobs`: UTF-8 text in `content`, anything else (and what git
/// calls binary) as exact bytes.
pub fn batch(rows: &[BlobRow]) -> Result<RecordBatch> {
    let rows: Vec<StoredBlob> = rows
        .iter()
        .map(|r| {
            let (is_utf8, content, content_bytes) = match &r.content {
                Some(c) => match std::str::from_utf8(c) {
                    Ok(s) if !r.is_binary => (true, Some(s), None),
                    Ok(_) => (true, None, Some(c.clone())),
                    Err(_) => (false, None, Some(c.clone())),
                },
                // Not read (over the cap): unknown, reported as not UTF-8.
                None => (false, None, None),
            };
            StoredBlob {
                blob_sha: &r.sha,
                size: r.size as i64,
                is_binary: r.is_binary,
                is_utf8,
                stored: r.content.is_some(),
                content,
                content_bytes,
            }
        })
        .collect();
    to_batch(FILE_BLOBS, &rows)
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
    lake.insert_absent(FILE_BLOBS, &batch(&rows)?, &["blob_sha"], None, LONG_TEXT).await
}

/// Appends blobs the caller believes the store lacks: ids it took from a set that [`known`]
/// started, so that parallel workers of one process never read the same blob twice. Another
/// process may have stored some since; the commit-time check drops those.
pub async fn append_new(lake: &Lake, rows: &[BlobRow]) -> Result<()> {
    lake.insert_absent(FILE_BLOBS, &batch(rows)?, &["blob_sha"], None, LONG_TEXT).await?;
    Ok(())
}
