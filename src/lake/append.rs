//! Appends: batches straight into a small bookkeeping table, one staged file committed by
//! itself, and rows whose key the table does not hold yet (content-addressed tables that
//! several writers meet at once).

use std::collections::{HashMap, HashSet};

use super::commit;
use super::failpoint::failpoint;
use super::tables::table_name_of;
use super::{writer_properties, Codec, Lake, TableWriter};
use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;

impl Lake {
    /// Appends batches to a table (small bookkeeping tables; bulk data uses staged files).
    pub async fn append(&self, table: DeltaTable, batches: Vec<RecordBatch>) -> Result<DeltaTable> {
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(table);
        }
        let name = table_name_of(&table);
        failpoint(&format!("commit.before:{name}"));
        let t = table.write(batches).with_save_mode(SaveMode::Append).await.context("appending to table")?;
        failpoint(&format!("commit.after:{name}"));
        Ok(t)
    }

    /// Appends `batch` to table `name` (created from its schema file if missing) as one staged
    /// Parquet file committed by itself: a commit that only adds.
    pub async fn append_staged(&self, name: &str, batch: &RecordBatch, long_text: &[&str]) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mut table = self.ensure_contract_table(name).await?;
        let key = uuid::Uuid::new_v4().simple().to_string();
        let mut w =
            TableWriter::new(self, name, &key, &batch.schema(), None, writer_properties(long_text, &[], Codec::Zstd))?;
        w.write(batch)?;
        let files = w.finish()?;
        self.replace_key(&mut table, &key, files, "append".into(), HashMap::new()).await?;
        Ok(())
    }

    /// Appends the rows of `batch` whose key (the values of the `key` columns) table `name`
    /// does not hold yet, each key once, in a commit made over the version that check read:
    /// when another writer (a worker of another shard) commits first, the check runs again
    /// over the new version, so a key is never written twice however many writers race. For
    /// tables keyed by content (`file_blobs` by blob, `blob_embeddings` by blob and chunk),
    /// where workers of different repositories meet the same blobs. `scope` narrows what
    /// counts as held (e.g. `model = '…'`). Returns the rows written.
    pub async fn insert_absent(
        &self,
        name: &str,
        batch: &RecordBatch,
        key: &[&str],
        scope: Option<&str>,
        long_text: &[&str],
    ) -> Result<usize> {
        use arrow::array::BooleanArray;
        if batch.num_rows() == 0 {
            return Ok(0);
        }
        if key.is_empty() {
            bail!("inserting into `{name}`: no key columns");
        }
        let keys = row_keys(batch, key)?;
        let wanted: std::collections::BTreeSet<&str> = keys.iter().flatten().map(String::as_str).collect();
        let mut table = self.ensure_contract_table(name).await?;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            table.load().await?;
            let held = self.held_keys(&table, name, key, scope, &wanted).await?;
            // Rows of absent keys; a key's rows are kept together.
            let keep: BooleanArray =
                keys.iter().map(|k| Some(k.as_ref().is_some_and(|k| !held.contains(k.as_str())))).collect();
            let rows = arrow::compute::filter_record_batch(batch, &keep)?;
            if rows.num_rows() == 0 {
                return Ok(0);
            }
            let file_key = uuid::Uuid::new_v4().simple().to_string();
            let mut w = TableWriter::new(
                self,
                name,
                &file_key,
                &rows.schema(),
                None,
                writer_properties(long_text, &[], Codec::Zstd),
            )?;
            w.write(&rows)?;
            let mut files = w.finish()?;
            self.upload(name, &mut files).await?;
            let staged: Vec<String> = files.iter().map(|f| f.rel_path.clone()).collect();
            failpoint(&format!("commit.before:{name}"));
            match commit::append_over_read_version(&table, files).await? {
                Some(_) => {
                    failpoint(&format!("commit.after:{name}"));
                    return Ok(rows.num_rows());
                }
                None if attempt < commit::MAX_COMMIT_ATTEMPTS => {
                    // The file never entered the log: remove it and decide again.
                    self.delete_unlanded(name, &staged).await;
                    tracing::debug!(table = name, attempt, "insert-if-absent lost a commit race; checking again");
                    tokio::time::sleep(commit::backoff(attempt)).await;
                }
                None => bail!("inserting into `{name}`: {attempt} commit races lost in a row; try again"),
            }
        }
    }

    /// Which of `wanted` (keys joined by [`KEY_SEPARATOR`]) the version of `table` holds in
    /// the `key` columns.
    async fn held_keys(
        &self,
        table: &DeltaTable,
        name: &str,
        key: &[&str],
        scope: Option<&str>,
        wanted: &std::collections::BTreeSet<&str>,
    ) -> Result<HashSet<String>> {
        if table.snapshot()?.log_data().num_files() == 0 {
            return Ok(HashSet::new());
        }
        let ctx = SessionContext::new();
        table.update_datafusion_session(&ctx.state())?;
        ctx.register_table(name, table.table_provider().await?)?;
        let mut held = HashSet::new();
        let list: Vec<&str> = wanted.iter().copied().collect();
        let joined = if key.len() == 1 {
            format!("CAST({} AS VARCHAR)", key[0])
        } else {
            let parts: Vec<String> = key.iter().map(|k| format!("CAST({k} AS VARCHAR)")).collect();
            format!("concat_ws(chr({}), {})", KEY_SEPARATOR.chars().next().map_or(31, u32::from), parts.join(", "))
        };
        // In slices: an IN list of tens of thousands of literals plans slowly.
        for part in list.chunks(2000) {
            let values = part.iter().map(|k| format!("'{}'", k.replace('\'', "''"))).collect::<Vec<_>>().join(", ");
            let extra = scope.map(|s| format!(" AND ({s})")).unwrap_or_default();
            let sql = format!("SELECT DISTINCT {joined} FROM {name} WHERE {joined} IN ({values}){extra}");
            held.extend(crate::query::rows::<String>(&ctx, &sql).await?);
        }
        Ok(held)
    }

    /// Deletes files staged for table `name` (table-relative paths) that no commit took in:
    /// the writer lost a commit race and decides again.
    pub(crate) async fn delete_unlanded(&self, name: &str, rel: &[String]) {
        for r in rel {
            let (store, path) = self.object(&format!("{name}/{r}"));
            // A file left behind is unreferenced by the log: vacuum removes it.
            let _ = store.delete(&path).await;
        }
    }
}

/// Joins the values of a multi-column key (a character no blob id or number holds).
pub(crate) const KEY_SEPARATOR: &str = "\u{1f}";

/// The key of every row of `batch`: the values of its `key` columns as text, joined by
/// [`KEY_SEPARATOR`] (a character no repository name, number or sha holds); `None` where a
/// key column is NULL.
pub(crate) fn row_keys(batch: &RecordBatch, key: &[impl AsRef<str>]) -> Result<Vec<Option<String>>> {
    use arrow::array::{Array, AsArray};
    let cols = key
        .iter()
        .map(|k| {
            let k = k.as_ref();
            let c = batch.column_by_name(k).with_context(|| format!("no key column `{k}`"))?;
            Ok(arrow::compute::cast(c, &arrow::datatypes::DataType::Utf8)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((0..batch.num_rows())
        .map(|i| {
            let parts: Option<Vec<&str>> = cols
                .iter()
                .map(|c| {
                    let c = c.as_string::<i32>();
                    c.is_valid(i).then(|| c.value(i))
                })
                .collect();
            parts.map(|p| p.join(KEY_SEPARATOR))
        })
        .collect())
}
