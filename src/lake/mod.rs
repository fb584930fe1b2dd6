//! The lake: Delta tables, one per name, under one root — a local directory or a prefix of an
//! object store (`s3://bucket/prefix`, `gs://…`, `az://…`, `file://…`) — and the few operations
//! every stage needs on them: create with a schema, write Parquet files, replace the files one
//! *key* produced in a single transaction, append, merge, and register everything in a
//! DataFusion session.
//!
//! Replacement by key is what makes jobs idempotent: each data file's name starts with the
//! key of the input that produced it (`2015-01-01-15.<uuid>.parquet`), and a rerun for that
//! key removes those files and adds the new ones in one commit, so readers see either the old
//! rows or the new ones, never both or neither. Several writers may commit to one table at
//! once: a commit that loses the race is retried over the new version unless another writer
//! replaced the same key, which is an error naming the key ([`commit`]).
//!
//! Also here: where the bytes live and how credentials stay out of messages ([`store`]), the
//! Parquet writer ([`writer`]), each job's run records ([`runs`]), leases that keep two runs
//! off the same inputs ([`lease`]), and the content-addressed blob store that two stages write
//! ([`blobs`]).
//!
//! Not here: what goes into the tables (the stage modules) and SQL functions (a session has
//! none until the layer that plans a query registers them).

pub mod blobs;
pub mod commit;

pub mod lease;
pub mod maintain;
pub mod runs;
pub mod store;
mod upsert;
pub mod writer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::StructType;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::Value;
use url::Url;

pub use writer::{
    conform, conform_for_writer, writer_properties, written_as, Codec, ColumnStats, StagedFile, TableWriter,
};

/// A lake: its root URL, the store behind it and the options that reach it.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The root, ending in `/`.
    url: Url,
    store: Arc<dyn ObjectStore>,
    /// The root's path inside `store`.
    prefix: ObjectPath,
    /// Storage options for deltalake (credentials, endpoint).
    options: BTreeMap<String, String>,
    /// The directory, for a local lake.
    local: Option<PathBuf>,
    /// Where writers stage Parquet files before upload, for an object-store lake.
    staging: Option<Arc<tempfile::TempDir>>,
}

impl Lake {
    /// Opens the lake at a local directory (created if needed) or a store URL, with the store
    /// options of the environment.
    pub fn open(location: &str) -> Result<Lake> {
        Lake::open_with(location, &[])
    }

    /// [`Lake::open`] with explicit storage options (`--storage-option KEY=VALUE`) over the
    /// environment's.
    pub fn open_with(location: &str, given: &[(String, String)]) -> Result<Lake> {
        let options = store::options(given);
        let is_url = location.contains("://");
        if !is_url || location.starts_with("file://") {
            let path = PathBuf::from(location.strip_prefix("file://").unwrap_or(location));
            std::fs::create_dir_all(&path).with_context(|| format!("creating lake directory {}", path.display()))?;
            let root = path.canonicalize().with_context(|| format!("resolving {}", path.display()))?;
            let url = Url::from_directory_path(&root)
                .map_err(|_| anyhow::anyhow!("{} is not an absolute path", root.display()))?;
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
            let prefix = ObjectPath::from_filesystem_path(&root)?;
            return Ok(Lake { url, store, prefix, options, local: Some(root), staging: None });
        }
        store::register_handlers();
        let mut url = Url::parse(location).with_context(|| format!("lake {location:?} is not a URL"))?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let (store, prefix) = store::open(&url, &options)?;
        let staging =
            tempfile::Builder::new().prefix("swelake-staging-").tempdir().context("creating a staging directory")?;
        Ok(Lake { url, store, prefix, options, local: None, staging: Some(Arc::new(staging)) })
    }

    /// The lake's location as it may be shown (no credentials).
    pub fn location(&self) -> String {
        match &self.local {
            Some(p) => p.display().to_string(),
            None => store::display_url(&self.url),
        }
    }

    /// The directory of a local lake (`None` for an object-store lake).
    pub fn local_root(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    /// The storage options the lake was opened with (for readers of its files).
    pub fn storage_options(&self) -> &BTreeMap<String, String> {
        &self.options
    }

    /// The store and the path of `rel` (a path under the lake's root) in it.
    pub fn object(&self, rel: &str) -> (Arc<dyn ObjectStore>, ObjectPath) {
        let mut p = self.prefix.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        (self.store.clone(), p)
    }

    /// Where `rel` (a path under the root) is, as it may be shown: a local path or a store URL.
    pub fn display_of(&self, rel: &str) -> String {
        match &self.local {
            Some(root) => root.join(rel).display().to_string(),
            None => format!("{}{rel}", self.location()),
        }
    }

    /// The URL of table `name`.
    pub fn table_url(&self, name: &str) -> Url {
        self.url.join(&format!("{name}/")).expect("table names are plain path segments")
    }

    /// Where a writer of `table` puts its files, and whether they are staged for upload.
    pub(crate) fn writer_dir(&self, table: &str) -> (PathBuf, bool) {
        match (&self.local, &self.staging) {
            (Some(root), _) => (root.join(table), false),
            (None, Some(staging)) => (staging.path().join(table), true),
            (None, None) => unreachable!("an object-store lake has a staging directory"),
        }
    }

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

    /// Uploads the staged files of an object-store lake into table `name` (a no-op for files
    /// already in place).
    pub(crate) async fn upload(&self, name: &str, files: &mut [StagedFile]) -> Result<()> {
        failpoint(&format!("upload.before:{name}"));
        for f in files.iter_mut() {
            let Some(local) = f.local.take() else { continue };
            let (store, path) = self.object(&format!("{name}/{}", f.rel_path));
            // The store's client retries transient failures (5xx, timeouts, resets) itself.
            put_file(store.as_ref(), &path, &local)
                .await
                .with_context(|| format!("uploading {name}/{}", f.rel_path))?;
            let _ = std::fs::remove_file(&local);
        }
        failpoint(&format!("upload.after:{name}"));
        Ok(())
    }

    /// Commits `files` as the complete output of `key`: removes every active file whose name
    /// starts with `{key}.` and adds the new ones, in one transaction. Returns the new table
    /// version, or `None` when there was nothing to add or remove.
    pub async fn replace_key(
        &self,
        table: &mut DeltaTable,
        key: &str,
        files: Vec<StagedFile>,
        predicate: String,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        self.replace_keys(table, &[key.to_string()], files, predicate, app_metadata).await
    }

    /// [`Lake::replace_key`] for several keys in one transaction.
    pub async fn replace_keys(
        &self,
        table: &mut DeltaTable,
        keys: &[String],
        mut files: Vec<StagedFile>,
        predicate: String,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        let name = table_name_of(table);
        self.upload(&name, &mut files).await?;
        failpoint(&format!("commit.before:{name}"));
        let v = commit::replace_keys(table, keys, files, predicate, app_metadata).await?;
        failpoint(&format!("commit.after:{name}"));
        Ok(v)
    }

    /// Commits `files` as the whole content of `table`: every active file is removed and the
    /// new ones added, in one transaction (an overwrite whose rows were streamed to staged
    /// files rather than held in memory). Returns the new version.
    pub async fn replace_all(
        &self,
        table: &mut DeltaTable,
        mut files: Vec<StagedFile>,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        let name = table_name_of(table);
        self.upload(&name, &mut files).await?;
        failpoint(&format!("commit.before:{name}"));
        let v = commit::replace(table, commit::Replace::All, files, "overwrite".into(), app_metadata).await?;
        failpoint(&format!("commit.after:{name}"));
        Ok(v)
    }

    /// Delta MERGE of `source` into table `name` (created with `schema` if missing) on the
    /// `keys` columns: matched rows are updated (only by newer rows when `newer_by` names a
    /// column), the others inserted. Returns the new table version.
    pub async fn upsert(
        &self,
        name: &str,
        source: datafusion::prelude::DataFrame,
        schema: &Schema,
        keys: &[String],
        newer_by: Option<&str>,
    ) -> Result<Option<i64>> {
        if keys.is_empty() {
            bail!("an upsert into `{name}` needs key columns");
        }
        let mut table = self.ensure_table(name, schema, &[]).await?;
        let cols: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let on = keys.iter().map(|k| format!("target.{k} = source.{k}")).collect::<Vec<_>>().join(" AND ");
        failpoint(&format!("commit.before:{name}"));
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let newer = newer_by.map(str::to_string);
            let (cols_u, cols_i) = (cols.clone(), cols.clone());
            let result = table
                .clone()
                .merge(source.clone(), on.clone())
                .with_source_alias("source")
                .with_target_alias("target")
                .when_matched_update(move |mut u| {
                    if let Some(n) = &newer {
                        u = u.predicate(format!("source.{n} >= target.{n}"));
                    }
                    for c in &cols_u {
                        u = u.update(c.as_str(), format!("source.{c}"));
                    }
                    u
                })?
                .when_not_matched_insert(move |mut i| {
                    for c in &cols_i {
                        i = i.set(c.as_str(), format!("source.{c}"));
                    }
                    i
                })?
                .await;
            match result {
                Ok((t, _metrics)) => {
                    failpoint(&format!("commit.after:{name}"));
                    return Ok(t.version().map(|v| v as i64));
                }
                // Another writer (a worker of another shard) committed files the merge may
                // have had to read: merge again over the new version (a merge is idempotent).
                Err(e) if commit::is_conflict(&e) && attempt < commit::MAX_COMMIT_ATTEMPTS => {
                    tracing::debug!(table = name, attempt, "merge conflicted with another writer; merging again");
                    tokio::time::sleep(commit::backoff(attempt)).await;
                    table.load().await?;
                }
                Err(e) => return Err(anyhow::Error::new(e)).with_context(|| format!("merging into `{name}`")),
            }
        }
    }

    /// Deletes the rows matching a SQL predicate (a no-op when the table does not exist).
    pub async fn delete_where(&self, name: &str, predicate: &str) -> Result<()> {
        if !self.has_table(name).await? {
            return Ok(());
        }
        let table = self.open_table(name).await?;
        table
            .delete()
            .with_predicate(predicate)
            .await
            .with_context(|| format!("deleting from `{name}` where {predicate}"))?;
        Ok(())
    }

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

    /// A DataFusion session with every table of the lake registered under its name. It has
    /// no swelake SQL functions: the layer that plans queries adds them (`udfs::register_all`).
    pub async fn session(&self) -> Result<SessionContext> {
        Ok(self.session_at_versions().await?.0)
    }

    /// [`Lake::session`] and the version of each table it registered: what a cache of
    /// anything computed from the tables keys on.
    pub async fn session_at_versions(&self) -> Result<(SessionContext, BTreeMap<String, i64>)> {
        let ctx = SessionContext::new_with_config(session_config()?);
        let mut versions = BTreeMap::new();
        for name in self.tables().await? {
            let table = self.open_table(&name).await?;
            table.update_datafusion_session(&ctx.state())?;
            let provider = table.table_provider().await.with_context(|| format!("reading table `{name}`"))?;
            ctx.register_table(name.as_str(), provider)?;
            versions.insert(name, table.version().map_or(-1, |v| v as i64));
        }
        Ok((ctx, versions))
    }

    /// [`Lake::session`] with each of `optional` that does not exist yet registered as an
    /// empty table of its schema file's columns, so queries over optional inputs plan either way.
    pub async fn session_with(&self, optional: &[&str]) -> Result<SessionContext> {
        let ctx = self.session().await?;
        for name in optional {
            if !self.has_table(name).await? {
                let schema = crate::schema::arrow(name)?;
                let empty = datafusion::datasource::MemTable::try_new(schema, vec![vec![]])?;
                ctx.register_table(*name, Arc::new(empty))?;
            }
        }
        Ok(ctx)
    }

    /// Creates table `name` with the columns and partitioning of its schema file when missing.
    pub async fn ensure_contract_table(&self, name: &str) -> Result<DeltaTable> {
        let schema = crate::schema::arrow(name)?;
        let partition_by = crate::schema::partition_by(name)?;
        let parts: Vec<&str> = partition_by.iter().map(|s| s.as_str()).collect();
        self.ensure_table(name, &schema, &parts).await
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
}

impl Lake {
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
}

/// Joins the values of a multi-column key (a character no blob id or number holds).
const KEY_SEPARATOR: &str = "\u{1f}";

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

impl Lake {
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

/// A named point where a test can make the process die, as a crash would: `SWELAKE_FAILPOINT`
/// = `NAME` (or `NAME#N`, at the N-th time it is reached) aborts the process there, with no
/// cleanup. The names: `upload.before:TABLE`, `upload.after:TABLE`, `commit.before:TABLE`,
/// `commit.after:TABLE`, `shards.after`. With `NAME=pause`, the process sleeps 3 s there
/// instead (for tests of two runs at once).
pub fn failpoint(name: &str) {
    static HITS: std::sync::Mutex<BTreeMap<String, u32>> = std::sync::Mutex::new(BTreeMap::new());
    let Ok(spec) = std::env::var("SWELAKE_FAILPOINT") else { return };
    for one in spec.split(',') {
        let (one, pause) = match one.strip_suffix("=pause") {
            Some(p) => (p, true),
            None => (one, false),
        };
        let (point, nth) = match one.split_once('#') {
            Some((p, n)) => (p, n.parse().unwrap_or(1)),
            None => (one, 1),
        };
        if point != name {
            continue;
        }
        let mut hits = HITS.lock().unwrap_or_else(|e| e.into_inner());
        let n = hits.entry(name.to_string()).or_default();
        *n += 1;
        if *n == nth {
            if pause {
                std::thread::sleep(std::time::Duration::from_secs(3));
            } else {
                eprintln!("failpoint {name}: aborting");
                std::process::abort();
            }
        }
    }
}

/// The settings of every query session over the lake: DataFusion's defaults, then its own
/// `DATAFUSION_*` environment variables (e.g. `DATAFUSION_EXECUTION_TARGET_PARTITIONS=4`), so
/// an operator can tune a run without a new build.
pub fn session_config() -> Result<SessionConfig> {
    let config = SessionConfig::from_env().context("reading DATAFUSION_* settings from the environment")?;
    Ok(config.with_information_schema(true))
}

/// Whether a file name in `_delta_log` is a committed version or a checkpoint (not a writer's
/// temporary file).
fn is_log_entry(name: &str) -> bool {
    let version = name.split('.').next().unwrap_or("");
    let numbered = version.len() == 20 && version.bytes().all(|b| b.is_ascii_digit());
    name == "_last_checkpoint" || (numbered && (name.ends_with(".json") || name.ends_with(".parquet")))
}

fn local_has_table(dir: &Path) -> Result<bool> {
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
fn table_name_of(table: &DeltaTable) -> String {
    table.table_url().path_segments().and_then(|mut s| s.rfind(|p| !p.is_empty())).unwrap_or_default().to_string()
}

/// Copies a local file into the store, in parts for large files.
pub(crate) async fn put_file(store: &dyn ObjectStore, path: &ObjectPath, local: &Path) -> Result<()> {
    const SMALL: u64 = 8 << 20;
    let len = std::fs::metadata(local).with_context(|| format!("reading {}", local.display()))?.len();
    if len <= SMALL {
        let bytes = tokio::fs::read(local).await?;
        store.put(path, PutPayload::from(bytes)).await?;
        return Ok(());
    }
    use tokio::io::AsyncReadExt;
    let mut upload = object_store::WriteMultipart::new(store.put_multipart(path).await?);
    let mut f = tokio::fs::File::open(local).await?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        upload.write(&buf[..n]);
    }
    upload.finish().await?;
    Ok(())
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
