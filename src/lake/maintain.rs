//! Table maintenance: compact small files, write a checkpoint, vacuum files no live version
//! needs — and what a table looks like to an operator ([`TableStatus`]).
//!
//! Compaction keeps the key of every file (see the module doc of [`super`]): files are merged
//! only with files of the same key and partition, and the merged file is named by that key, so
//! a later rerun of the key still replaces exactly its rows. Files of unkeyed appends (the
//! run records, content-addressed blobs: written under random keys that are never replaced)
//! are merged freely within a partition. deltalake's own OPTIMIZE is not used: it would name
//! the merged files itself and lose their keys.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::Lake;

/// A file below this size counts as small.
pub const SMALL_FILE_BYTES: i64 = 8 << 20;

/// The shortest vacuum retention accepted: a reader that opened a version within it can
/// still read every file of that version.
pub const MIN_VACUUM_RETENTION: Duration = Duration::from_secs(3600);

/// What maintenance should do.
#[derive(Debug, Clone)]
pub struct MaintainOptions {
    /// Only this table (all tables when `None`).
    pub table: Option<String>,
    /// Delete files removed from the table longer ago than this (`None`: no vacuum).
    pub vacuum_retention: Option<Duration>,
    /// Merge small files into files of about this many bytes.
    pub target_file_bytes: i64,
}

impl Default for MaintainOptions {
    fn default() -> Self {
        MaintainOptions { table: None, vacuum_retention: None, target_file_bytes: 128 << 20 }
    }
}

/// What maintenance did to one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MaintainSummary {
    pub table: String,
    pub files_before: usize,
    pub files_after: usize,
    pub files_compacted: usize,
    /// Groups left alone because another writer changed them meanwhile.
    pub groups_skipped: usize,
    pub checkpoint_version: Option<i64>,
    pub files_vacuumed: usize,
    pub version: i64,
}

/// A table as an operator sees it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub version: i64,
    pub files: usize,
    pub bytes: i64,
    pub rows: i64,
    pub small_files: usize,
    /// Commit time (ms since the epoch) of the last compaction, if any was recorded.
    pub last_optimize_ms: Option<i64>,
    /// The version of the latest checkpoint.
    pub last_checkpoint_version: Option<i64>,
    pub commits: usize,
}

/// Files merged together: those of one partition value and one key (`""`: unkeyed appends).
type GroupKey = (Option<String>, String);

/// The key of a data file: its name up to the first `.`.
fn key_of(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name)
}

/// Whether a key is a random one of an unkeyed append (never replaced).
fn unkeyed(key: &str) -> bool {
    (key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit())) || key.starts_with("part-")
}

impl Lake {
    /// The status of table `name`.
    pub async fn table_status(&self, name: &str) -> Result<TableStatus> {
        let table = self.open_table(name).await?;
        let snapshot = table.snapshot()?;
        let mut st = TableStatus { table: name.to_string(), version: snapshot.version() as i64, ..Default::default() };
        for f in snapshot.log_data().iter() {
            st.files += 1;
            st.bytes += f.size();
            st.rows += f.num_records().unwrap_or(0) as i64;
            if f.size() < SMALL_FILE_BYTES {
                st.small_files += 1;
            }
        }
        let history: Vec<_> = futures::StreamExt::collect::<Vec<_>>(table.history(None)).await;
        st.commits = history.len();
        for c in history.into_iter().flatten() {
            if c.operation.as_deref() == Some("OPTIMIZE") {
                st.last_optimize_ms = st.last_optimize_ms.max(c.timestamp);
            }
        }
        let (store, last) = self.object(&format!("{name}/_delta_log/_last_checkpoint"));
        if let Ok(got) = store.get(&last).await {
            let bytes = got.bytes().await?;
            let v: serde_json::Value = serde_json::from_slice(&bytes).context("reading _last_checkpoint")?;
            st.last_checkpoint_version = v.get("version").and_then(|v| v.as_i64());
        }
        Ok(st)
    }

    /// Compacts, checkpoints and vacuums the tables `opts` names.
    pub async fn maintain(&self, opts: &MaintainOptions) -> Result<Vec<MaintainSummary>> {
        if let Some(r) = opts.vacuum_retention {
            if r < MIN_VACUUM_RETENTION {
                bail!(
                    "a vacuum retention of {}s could delete files that readers of recent versions still need; \
                     use at least {}s",
                    r.as_secs(),
                    MIN_VACUUM_RETENTION.as_secs()
                );
            }
        }
        let names = match &opts.table {
            Some(t) => {
                if !self.has_table(t).await? {
                    bail!("table `{t}` does not exist in lake {}", self.location());
                }
                vec![t.clone()]
            }
            None => self.tables().await?,
        };
        let mut out = Vec::new();
        for name in names {
            out.push(self.maintain_table(&name, opts).await.with_context(|| format!("maintaining `{name}`"))?);
        }
        Ok(out)
    }

    async fn maintain_table(&self, name: &str, opts: &MaintainOptions) -> Result<MaintainSummary> {
        let mut table = self.open_table(name).await?;
        let mut summary = MaintainSummary { table: name.to_string(), ..Default::default() };
        let snapshot = table.snapshot()?;
        let partition_by = snapshot.metadata().partition_columns().to_vec();
        if partition_by.len() > 1 {
            bail!("tables partitioned by more than one column are not compacted");
        }
        // Small files by (partition value, key group).
        let mut groups: BTreeMap<GroupKey, Vec<(String, i64)>> = BTreeMap::new();
        for f in snapshot.log_data().iter() {
            summary.files_before += 1;
            let path = f.path().to_string();
            if f.size() >= SMALL_FILE_BYTES {
                continue;
            }
            let part = match partition_by.first() {
                Some(col) => f.partition_values().and_then(|pv| {
                    let fields = pv.fields().to_vec();
                    let values = pv.values().to_vec();
                    fields.iter().position(|fl| fl.name() == col).and_then(|i| {
                        let v = &values[i];
                        (!v.is_null()).then(|| deltalake::kernel::scalars::ScalarExt::serialize(v))
                    })
                }),
                None => None,
            };
            let key = key_of(&path);
            let group = if unkeyed(key) { String::new() } else { key.to_string() };
            groups.entry((part, group)).or_default().push((path, f.size()));
        }
        let schema = snapshot.snapshot().arrow_schema();
        for ((part, key), files) in groups {
            if files.len() < 2 {
                continue;
            }
            // Chunks of about the target size, each one new file.
            let mut chunk: Vec<String> = Vec::new();
            let mut bytes = 0i64;
            let mut chunks = Vec::new();
            for (p, size) in files {
                if bytes + size > opts.target_file_bytes && chunk.len() >= 2 {
                    chunks.push(std::mem::take(&mut chunk));
                    bytes = 0;
                }
                bytes += size;
                chunk.push(p);
            }
            if chunk.len() >= 2 {
                chunks.push(chunk);
            }
            for chunk in chunks {
                match self
                    .compact(&mut table, name, &schema, partition_by.first(), part.as_deref(), &key, &chunk)
                    .await?
                {
                    true => summary.files_compacted += chunk.len(),
                    false => summary.groups_skipped += 1,
                }
            }
        }
        table.load().await?;
        deltalake::checkpoints::create_checkpoint(&table, None).await.context("writing a checkpoint")?;
        summary.checkpoint_version = table.version().map(|v| v as i64);
        if let Some(retention) = opts.vacuum_retention {
            let retention = chrono::Duration::from_std(retention)?;
            let (t, metrics) = table
                .vacuum()
                .with_retention_period(retention)
                .with_enforce_retention_duration(false)
                .await
                .context("vacuum")?;
            summary.files_vacuumed = metrics.files_deleted.len();
            table = t;
        }
        let after = table.snapshot()?;
        summary.files_after = after.log_data().iter().count();
        summary.version = after.version() as i64;
        Ok(summary)
    }
}
