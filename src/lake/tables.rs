//! Which tables the lake holds, opening them, and creating them from a schema (a schema
//! file's, or a writer's): a table exists once a version is committed; an older table gains the
//! columns a newer swelake added at the end.

use std::collections::HashMap;
use std::path::Path;

use super::Lake;
use anyhow::{bail, Context, Result};
use arrow::datatypes::Schema;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::StructType;
use deltalake::DeltaTable;
use futures::StreamExt;
use object_store::ObjectStore;

impl Lake {
    /// Whether a Delta table of this name exists.
    ///
    /// Only a committed version counts: while a writer creates the table, `_delta_log` can hold
    /// only its staging file (the local store writes `…0.json#1` and then links it), and a killed
    /// run can leave the directory empty; a reader that took either for a table would fail on
    /// an empty log.
    pub async fn has_table(&self, name: &str) -> Result<bool> {
        if let Some(root) = &self.local {
            return local_has_table(&root.join(name));
        }
        let (store, log) = self.object(&format!("{name}/_delta_log"));
        let mut listing = store.list(Some(&log));
        while let Some(item) = listing.next().await {
            let meta =
                item.map_err(|e| anyhow::Error::new(e).context(format!("listing {}/{name}", self.location())))?;
            if meta.location.filename().is_some_and(is_log_entry) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Names of all Delta tables in the lake, sorted.
    pub async fn tables(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        if let Some(root) = &self.local {
            for entry in std::fs::read_dir(root).with_context(|| format!("listing {}", root.display()))? {
                let entry = entry?;
                if local_has_table(&entry.path())? {
                    if let Some(name) = entry.file_name().to_str() {
                        out.push(name.to_string());
                    }
                }
            }
        } else {
            let listing = self
                .store
                .list_with_delimiter(Some(&self.prefix))
                .await
                .with_context(|| format!("listing {}", self.location()))?;
            for dir in listing.common_prefixes {
                if let Some(name) = dir.filename() {
                    if self.has_table(name).await? {
                        out.push(name.to_string());
                    }
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn builder(&self, name: &str) -> Result<deltalake::DeltaTableBuilder> {
        let options: HashMap<String, String> = self.options.clone().into_iter().collect();
        Ok(deltalake::DeltaTableBuilder::from_url(self.table_url(name))?.with_storage_options(options))
    }

    /// Opens a table, which must exist.
    pub async fn open_table(&self, name: &str) -> Result<DeltaTable> {
        if !self.has_table(name).await? {
            bail!("table `{name}` does not exist in lake {}", self.location());
        }
        let mut table = self.builder(name)?.build()?;
        // A store's listing can briefly lag a version another writer just put (the log is
        // then listed empty): wait a little for it rather than fail the run.
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            match table.load().await {
                Ok(()) => return Ok(table),
                Err(e) if wait.as_millis() <= 1600 && e.to_string().contains("No files in log segment") => {
                    tracing::debug!(table = name, error = %e, "the log listed empty; retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("opening table `{name}`"))),
            }
        }
    }

    /// Opens a table, creating it empty with `schema` (partition columns included, listed in
    /// `partition_by`) when missing. An existing table must have the same column names. Two
    /// writers creating a table at once both end with the one table.
    pub async fn ensure_table(&self, name: &str, schema: &Schema, partition_by: &[&str]) -> Result<DeltaTable> {
        if self.has_table(name).await? {
            return self.checked_open(name, schema).await;
        }
        let kernel: StructType = schema.try_into_kernel().with_context(|| format!("schema of `{name}`"))?;
        if let Some(root) = &self.local {
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A handle without loading: probing a table that does not exist yet logs errors.
        let table = self.builder(name)?.build()?;
        let created = table
            .create()
            .with_table_name(name)
            .with_columns(kernel.fields().cloned())
            .with_partition_columns(partition_by.iter().map(|s| s.to_string()))
            // Without retries: deltalake would commit a second CREATE over one that won the
            // race, and that protocol change fails every writer's commit in flight.
            .with_commit_properties(deltalake::kernel::transaction::CommitProperties::default().with_max_retries(0))
            .await;
        match created {
            Ok(t) => Ok(t),
            // Another writer created it first: use theirs, if it is the same table.
            Err(e) if self.has_table(name).await.unwrap_or(false) => {
                tracing::debug!(table = name, error = %e, "created by another writer meanwhile");
                self.checked_open(name, schema).await
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("creating table `{name}`"))),
        }
    }

    async fn checked_open(&self, name: &str, schema: &Schema) -> Result<DeltaTable> {
        let table = self.open_table(name).await?;
        let existing = table.snapshot()?.snapshot().arrow_schema();
        let have: Vec<&str> = existing.fields().iter().map(|f| f.name().as_str()).collect();
        let want: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        if have.len() < want.len() && want[..have.len()] == have[..] {
            // A newer version added columns at the end: add them to the table (Delta adds
            // columns as nullable; old rows read NULL), so an older lake keeps working.
            let added: Vec<&arrow::datatypes::Field> =
                schema.fields()[have.len()..].iter().map(|f| f.as_ref()).collect();
            let nullable: Vec<arrow::datatypes::Field> =
                added.iter().map(|f| arrow::datatypes::Field::new(f.name(), f.data_type().clone(), true)).collect();
            let kernel: StructType =
                (&Schema::new(nullable)).try_into_kernel().with_context(|| format!("the new columns of `{name}`"))?;
            let fields: Vec<_> = kernel.fields().cloned().collect();
            tracing::info!(table = name, columns = ?added.iter().map(|f| f.name()).collect::<Vec<_>>(), "adding new columns to an older table");
            let table = table
                .add_columns()
                .with_fields(fields)
                .await
                .with_context(|| format!("adding the new columns of `{name}`"))?;
            return Ok(table);
        }
        if have != want {
            bail!(
                "table `{name}` has columns {have:?} but this version of swelake writes {want:?}; \
                 move the old table away or migrate it"
            );
        }
        Ok(table)
    }

    /// Creates table `name` with the columns and partitioning of its schema file when missing.
    pub async fn ensure_contract_table(&self, name: &str) -> Result<DeltaTable> {
        let schema = crate::schema::arrow(name)?;
        let partition_by = crate::schema::partition_by(name)?;
        let parts: Vec<&str> = partition_by.iter().map(|s| s.as_str()).collect();
        self.ensure_table(name, &schema, &parts).await
    }
}

/// Whether a file name in `_delta_log` is a committed version or a checkpoint (not a writer's
/// temporary file).
pub(crate) fn is_log_entry(name: &str) -> bool {
    let version = name.split('.').next().unwrap_or("");
    let numbered = version.len() == 20 && version.bytes().all(|b| b.is_ascii_digit());
    name == "_last_checkpoint" || (numbered && (name.ends_with(".json") || name.ends_with(".parquet")))
}

pub(crate) fn local_has_table(dir: &Path) -> Result<bool> {
    let log = dir.join("_delta_log");
    let Ok(entries) = std::fs::read_dir(&log) else { return Ok(false) };
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", log.display()))?;
        if entry.file_name().to_str().is_some_and(is_log_entry) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The table's directory name, from its URL.
pub(crate) fn table_name_of(table: &DeltaTable) -> String {
    table.table_url().path_segments().and_then(|mut s| s.rfind(|p| !p.is_empty())).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::is_log_entry;

    #[test]
    fn only_committed_versions_make_a_table() {
        for name in [
            "00000000000000000000.json",
            "00000000000000000010.checkpoint.parquet",
            "00000000000000000010.checkpoint.0000000001.0000000002.parquet",
            "_last_checkpoint",
        ] {
            assert!(is_log_entry(name), "{name}");
        }
        for name in [
            "_commit_3f1c.json.tmp",
            "00000000000000000000.json#1",
            "0000000000000000000.json",
            "00000000000000000000.crc",
            "x.json",
        ] {
            assert!(!is_log_entry(name), "{name}");
        }
    }
}
