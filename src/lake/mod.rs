//! The lake: a directory of Delta tables, one per name, and the few operations every stage
//! needs on them — create with a schema, write Parquet files, replace the files one *key*
//! produced in a single transaction, append, and register everything in a DataFusion session.
//!
//! Replacement by key is what makes jobs idempotent: each data file's name starts with the
//! key of the input that produced it (`2015-01-01-15.<uuid>.parquet`), and a rerun for that
//! key removes those files and adds the new ones in one commit, so readers see either the old
//! rows or the new ones, never both or neither.
//!
//! Also here: each job's run records ([`runs`]) and the content-addressed blob store that two
//! stages write ([`blobs`]).
//!
//! Not here: what goes into the tables (the stage modules), SQL functions (a session has none
//! until the layer that plans a query registers them), and object-store lakes, which need
//! deltalake's store handlers (see README, "Object storage").

pub mod blobs;
pub mod runs;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Add, StructType};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::DeltaTable;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use serde_json::Value;
use url::Url;

/// A lake rooted at a local directory.
#[derive(Debug, Clone)]
pub struct Lake {
    root: PathBuf,
    url: Url,
}

/// A Parquet file written into a table directory but not yet committed.
#[derive(Debug, Clone)]
pub struct StagedFile {
    /// Path relative to the table root, as recorded in the Delta log.
    pub rel_path: String,
    pub partition_values: HashMap<String, Option<String>>,
    pub size: i64,
    pub num_records: i64,
}

impl StagedFile {
    fn into_add(self) -> Add {
        Add {
            path: self.rel_path,
            partition_values: self.partition_values,
            size: self.size,
            modification_time: chrono::Utc::now().timestamp_millis(),
            data_change: true,
            stats: Some(format!("{{\"numRecords\":{}}}", self.num_records)),
            ..Default::default()
        }
    }
}

/// Parquet codec of the files a job writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// zstd level 1: small files, fast enough for most lakes (default).
    Zstd,
    /// LZ4 (raw): faster to write, ~1.5x larger files.
    Lz4,
    /// Snappy: the most widely readable.
    Snappy,
    /// Uncompressed.
    None,
}

impl Codec {
    fn parquet(self) -> Compression {
        match self {
            Codec::Zstd => Compression::ZSTD(ZstdLevel::try_new(1).expect("valid zstd level")),
            Codec::Lz4 => Compression::LZ4_RAW,
            Codec::Snappy => Compression::SNAPPY,
            Codec::None => Compression::UNCOMPRESSED,
        }
    }
}

/// Dictionary size per row group up to which a repeated-text column stays dictionary-encoded.
const REPEATED_TEXT_DICTIONARY_BYTES: usize = 8 << 20;

/// Writer settings for a table: the codec, and no page statistics on long text.
///
/// `long_text_columns` are mostly unique: no dictionary either (dictionaries of unique values
/// only cost time before the writer gives up on them). `repeated_text_columns` are long text
/// that repeats heavily in some inputs and not at all in others (event payloads: a
/// `{"action":"started"}` per star, copies in replicated test hours, unique pushes): they keep
/// a dictionary of up to 8 MB per row group and fall back to plain pages beyond it, which on
/// unique values costs nothing measurable and on repeated ones saves most of the encoding and
/// compression work (`swelake bench ingest`: both hours).
pub fn writer_properties(long_text_columns: &[&str], repeated_text_columns: &[&str], codec: Codec) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(codec.parquet())
        .set_max_row_group_row_count(Some(64 * 1024))
        .set_created_by(format!("swelake {}", env!("CARGO_PKG_VERSION")));
    for c in long_text_columns {
        let path = ColumnPath::from(*c);
        b = b
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_statistics_enabled(path, EnabledStatistics::None);
    }
    for c in repeated_text_columns {
        let path = ColumnPath::from(*c);
        b = b
            .set_column_dictionary_enabled(path.clone(), true)
            .set_column_dictionary_page_size_limit(path.clone(), REPEATED_TEXT_DICTIONARY_BYTES)
            .set_column_statistics_enabled(path, EnabledStatistics::None);
    }
    b.build()
}

impl Lake {
    /// Opens (creating if needed) the lake at a local directory or `file://` URL.
    pub fn open(location: &str) -> Result<Lake> {
        let path = if let Some(rest) = location.strip_prefix("file://") {
            PathBuf::from(rest)
        } else if location.contains("://") {
            bail!(
                "lake {location:?}: only local directories (or file:// URLs) can hold a lake in this build; \
                 object-store lakes are not wired yet (ingest can still read sources from object stores)"
            );
        } else {
            PathBuf::from(location)
        };
        std::fs::create_dir_all(&path).with_context(|| format!("creating lake directory {}", path.display()))?;
        let root = path.canonicalize().with_context(|| format!("resolving {}", path.display()))?;
        let url = Url::from_directory_path(&root)
            .map_err(|_| anyhow::anyhow!("{} is not an absolute path", root.display()))?;
        Ok(Lake { root, url })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn table_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn table_url(&self, name: &str) -> Url {
        self.url.join(&format!("{name}/")).expect("table names are plain path segments")
    }

    /// Whether a Delta table of this name exists.
    pub fn has_table(&self, name: &str) -> bool {
        self.table_dir(name).join("_delta_log").is_dir()
    }

    /// Names of all Delta tables in the lake, sorted.
    pub fn tables(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.root).with_context(|| format!("listing {}", self.root.display()))? {
            let entry = entry?;
            if entry.path().join("_delta_log").is_dir() {
                if let Some(name) = entry.file_name().to_str() {
                    out.push(name.to_string());
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Opens a table, which must exist.
    pub async fn open_table(&self, name: &str) -> Result<DeltaTable> {
        if !self.has_table(name) {
            bail!("table `{name}` does not exist in lake {}", self.root.display());
        }
        deltalake::open_table(self.table_url(name)).await.with_context(|| format!("opening table `{name}`"))
    }

    /// Opens a table, creating it empty with `schema` (partition columns included, listed in
    /// `partition_by`) when missing. An existing table must have the same column names.
    pub async fn ensure_table(&self, name: &str, schema: &Schema, partition_by: &[&str]) -> Result<DeltaTable> {
        if self.has_table(name) {
            let table = self.open_table(name).await?;
            let existing = table.snapshot()?.snapshot().arrow_schema();
            let have: Vec<&str> = existing.fields().iter().map(|f| f.name().as_str()).collect();
            let want: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            if have != want {
                bail!(
                    "table `{name}` has columns {have:?} but this version of swelake writes {want:?}; \
                     move the old table away or migrate it"
                );
            }
            return Ok(table);
        }
        let kernel: StructType = schema.try_into_kernel().with_context(|| format!("schema of `{name}`"))?;
        let dir = self.table_dir(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // A handle without loading: probing a table that does not exist yet logs errors.
        let table = deltalake::DeltaTableBuilder::from_url(self.table_url(name))?.build()?;
        let table = table
            .create()
            .with_table_name(name)
            .with_columns(kernel.fields().cloned())
            .with_partition_columns(partition_by.iter().map(|s| s.to_string()))
            .await
            .with_context(|| format!("creating table `{name}`"))?;
        Ok(table)
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
        files: Vec<StagedFile>,
        predicate: String,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        let prefixes: Vec<String> = keys.iter().map(|k| format!("{k}.")).collect();
        let snapshot = table.snapshot()?;
        let partition_by = snapshot.metadata().partition_columns().to_vec();
        let mut actions: Vec<Action> = snapshot
            .log_data()
            .iter()
            .filter(|f| {
                let path = f.path();
                let name = path.rsplit('/').next().unwrap_or_default();
                prefixes.iter().any(|p| name.starts_with(p.as_str()))
            })
            .map(|f| Action::Remove(f.remove_action(true)))
            .collect();
        actions.extend(files.into_iter().map(|f| Action::Add(f.into_add())));
        if actions.is_empty() {
            return Ok(None);
        }
        let op = DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: (!partition_by.is_empty()).then_some(partition_by),
            predicate: Some(predicate),
        };
        let commit = CommitBuilder::from(CommitProperties::default().with_metadata(app_metadata))
            .with_actions(actions)
            .build(Some(snapshot), table.log_store(), op)
            .await
            .with_context(|| format!("committing {} key(s) starting {:?}", keys.len(), keys.first()))?;
        let version = commit.version as i64;
        table.load().await?;
        Ok(Some(version))
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
        let table = self.ensure_table(name, schema, &[]).await?;
        let cols: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let on = keys.iter().map(|k| format!("target.{k} = source.{k}")).collect::<Vec<_>>().join(" AND ");
        let newer = newer_by.map(str::to_string);
        let (cols_u, cols_i) = (cols.clone(), cols);
        let (table, _metrics) = table
            .merge(source, on)
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
            .await
            .with_context(|| format!("merging into `{name}`"))?;
        Ok(table.version().map(|v| v as i64))
    }

    /// Deletes the rows matching a SQL predicate (a no-op when the table does not exist).
    pub async fn delete_where(&self, name: &str, predicate: &str) -> Result<()> {
        if !self.has_table(name) {
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
        table.write(batches).with_save_mode(SaveMode::Append).await.context("appending to table")
    }

    /// A DataFusion session with every table of the lake registered under its name. It has
    /// no swelake SQL functions: the layer that plans queries adds them (`udfs::register_all`).
    pub async fn session(&self) -> Result<SessionContext> {
        let config = SessionConfig::new().with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        for name in self.tables()? {
            let table = self.open_table(&name).await?;
            table.update_datafusion_session(&ctx.state())?;
            let provider = table.table_provider().await.with_context(|| format!("reading table `{name}`"))?;
            ctx.register_table(name.as_str(), provider)?;
        }
        Ok(ctx)
    }

    /// [`Lake::session`] with each of `optional` that does not exist yet registered as an
    /// empty table of its schema file's columns, so queries over optional inputs plan either way.
    pub async fn session_with(&self, optional: &[&str]) -> Result<SessionContext> {
        let ctx = self.session().await?;
        for name in optional {
            if !self.has_table(name) {
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

/// Writes record batches of one table into Parquet files under the table directory, one
/// open file per partition value, named `{key}.{uuid}.parquet`.
pub struct TableWriter {
    table_dir: PathBuf,
    key: String,
    file_schema: SchemaRef,
    /// Index of the partition column in incoming batches (dropped from the file data).
    partition: Option<(usize, String)>,
    props: WriterProperties,
    open: HashMap<String, (ArrowWriter<File>, String, i64)>,
    done: Vec<StagedFile>,
    /// Name files after their partition value instead of `key` (jobs that replace whole
    /// partitions use the partition value as the key).
    key_by_partition: bool,
}

impl TableWriter {
    /// `schema` is the full table schema; `partition_col`, if any, must be a Date32 or Utf8
    /// column of it.
    pub fn new(
        lake: &Lake,
        table: &str,
        key: &str,
        schema: &Schema,
        partition_col: Option<&str>,
        props: WriterProperties,
    ) -> Result<Self> {
        let partition = match partition_col {
            Some(p) => Some((schema.index_of(p)?, p.to_string())),
            None => None,
        };
        let fields: Vec<_> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, _)| partition.as_ref().is_none_or(|(pi, _)| pi != i))
            .map(|(_, f)| f.clone())
            .collect();
        Ok(TableWriter {
            table_dir: lake.table_dir(table),
            key: key.to_string(),
            file_schema: Arc::new(Schema::new(fields)),
            partition,
            props,
            open: HashMap::new(),
            done: Vec::new(),
            key_by_partition: false,
        })
    }

    /// Files are named `{partition value}.{uuid}.parquet` (see [`Lake::replace_keys`]).
    pub fn keyed_by_partition(mut self) -> Self {
        self.key_by_partition = true;
        self
    }

    /// The partition value of every row, as Delta writes it in paths and the log.
    fn partition_values(&self, batch: &RecordBatch) -> Result<Vec<String>> {
        let (idx, _) = self.partition.as_ref().expect("called only for partitioned tables");
        let col = batch.column(*idx);
        let fmt = arrow::util::display::ArrayFormatter::try_new(col.as_ref(), &Default::default())?;
        Ok((0..batch.num_rows()).map(|r| fmt.value(r).to_string()).collect())
    }

    /// Whether every row has the same partition value (the common case: one hour, one day),
    /// checked without formatting each row.
    fn single_partition(&self, batch: &RecordBatch) -> bool {
        use arrow::array::{Array, AsArray};
        let (idx, _) = self.partition.as_ref().expect("called only for partitioned tables");
        let col = batch.column(*idx);
        if col.null_count() > 0 {
            return false;
        }
        match col.data_type() {
            arrow::datatypes::DataType::Date32 => {
                let v = col.as_primitive::<arrow::datatypes::Date32Type>().values();
                v.iter().all(|x| *x == v[0])
            }
            arrow::datatypes::DataType::Utf8 => {
                let a = col.as_string::<i32>();
                (0..a.len()).all(|i| a.value(i) == a.value(0))
            }
            _ => false,
        }
    }

    /// Writes one batch (rows may span several partition values).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let Some((idx, _)) = self.partition.clone() else {
            return self.write_to(String::new(), batch.clone());
        };
        let data = batch.project(&(0..batch.num_columns()).filter(|i| *i != idx).collect::<Vec<_>>())?;
        if self.single_partition(batch) {
            let value = self.partition_values(&batch.slice(0, 1))?.remove(0);
            return self.write_to(value, data);
        }
        let values = self.partition_values(batch)?;
        let mut distinct = values.clone();
        distinct.sort();
        distinct.dedup();
        for v in distinct {
            let mask: arrow::array::BooleanArray = values.iter().map(|x| Some(*x == v)).collect();
            let part = arrow::compute::filter_record_batch(&data, &mask)?;
            self.write_to(v, part)?;
        }
        Ok(())
    }

    fn write_to(&mut self, value: String, data: RecordBatch) -> Result<()> {
        if !self.open.contains_key(&value) {
            let dir_rel = match &self.partition {
                Some((_, col)) => format!("{col}={value}/"),
                None => String::new(),
            };
            let key = if self.key_by_partition { value.as_str() } else { self.key.as_str() };
            let rel = format!("{dir_rel}{key}.{}.parquet", uuid::Uuid::new_v4());
            let path = self.table_dir.join(&rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
            }
            let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let writer = ArrowWriter::try_new(file, self.file_schema.clone(), Some(self.props.clone()))?;
            self.open.insert(value.clone(), (writer, rel, 0));
        }
        let (writer, _, rows) = self.open.get_mut(&value).expect("inserted above");
        writer.write(&data)?;
        *rows += data.num_rows() as i64;
        Ok(())
    }

    /// Closes every file and returns them for commit.
    pub fn finish(mut self) -> Result<Vec<StagedFile>> {
        let mut open: Vec<_> = self.open.drain().collect();
        open.sort_by(|a, b| a.0.cmp(&b.0));
        for (value, (writer, rel, rows)) in open {
            writer.close()?;
            let size = std::fs::metadata(self.table_dir.join(&rel))?.len() as i64;
            let mut partition_values = HashMap::new();
            if let Some((_, col)) = &self.partition {
                partition_values.insert(col.clone(), Some(value));
            }
            self.done.push(StagedFile { rel_path: rel, partition_values, size, num_records: rows });
        }
        Ok(self.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, StringArray};
    use arrow::datatypes::{DataType, Field};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::{Encoding, PageType};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    /// Writes `values` as column `payload` and returns the encodings of its data pages and the
    /// values read back.
    fn write_payloads(values: Vec<String>) -> (Vec<Encoding>, Vec<String>) {
        let schema = Arc::new(Schema::new(vec![Field::new("payload", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(values))]).unwrap();
        let file = tempfile::tempfile().unwrap();
        let props = writer_properties(&["id"], &["payload"], Codec::Zstd);
        let mut w = ArrowWriter::try_new(file.try_clone().unwrap(), schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file.try_clone().unwrap()).unwrap();
        let pages = SerializedFileReader::new(file).unwrap();
        let mut encodings: Vec<Encoding> = Vec::new();
        for page in pages.get_row_group(0).unwrap().get_column_page_reader(0).unwrap() {
            let page = page.unwrap();
            if page.page_type() != PageType::DICTIONARY_PAGE && !encodings.contains(&page.encoding()) {
                encodings.push(page.encoding());
            }
        }
        let mut back = Vec::new();
        for b in reader.build().unwrap() {
            let b = b.unwrap();
            let col = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            back.extend((0..col.len()).map(|i| col.value(i).to_string()));
        }
        (encodings, back)
    }

    #[test]
    fn repeated_text_keeps_a_dictionary_until_it_outgrows_the_limit() {
        // A few distinct payloads repeated: dictionary-encoded data pages only.
        let repeated: Vec<String> =
            (0..20_000).map(|i| format!("{{\"action\":\"started\",\"n\":{}}}", i % 7)).collect();
        let (enc, back) = write_payloads(repeated.clone());
        assert_eq!(enc, vec![Encoding::RLE_DICTIONARY]);
        assert_eq!(back, repeated);
        // Unique payloads past the dictionary limit: the writer falls back to plain pages,
        // and every value survives the switch.
        let unique: Vec<String> = (0..12_000).map(|i| format!("{i:>8}{}", "x".repeat(1000))).collect();
        assert!(unique.iter().map(String::len).sum::<usize>() > REPEATED_TEXT_DICTIONARY_BYTES);
        let (enc, back) = write_payloads(unique.clone());
        assert_eq!(enc, vec![Encoding::RLE_DICTIONARY, Encoding::PLAIN], "no fallback to plain pages");
        assert_eq!(back, unique);
    }
}
