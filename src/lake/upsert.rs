//! Upserts that rewrite only the files holding the keys they replace.
//!
//! A Delta MERGE without deletion vectors rewrites every file in which a source row matches,
//! and deltalake writes all it rewrote, with the inserts, into new files together: a table
//! upserted daily (pull_requests, issues) ends as one file that every MERGE reads and rewrites
//! whole — time and memory grow with the lake (a fifth generated day: 2.0 GB and 11 s for
//! pull_requests, against 1.3 GB and 3.5 s on the first). Here the key columns of every file
//! are read (a narrow scan), the few files that hold replaced keys are rewritten one at a
//! time without those rows, and the new rows go to files of their own, all in one commit.
//! The day's rows thus stay in the day's files, and the next day rewrites mostly those.
//!
//! What it keeps of MERGE: a key matched by a source row is replaced by it (with `newer_by`,
//! only when the source row is at least as new; otherwise the stored row stays and the source
//! row is dropped), other source rows are inserted, other stored rows stay. A key appearing
//! twice in the source is an error, as in MERGE.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};
use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use object_store::ObjectStoreExt;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use super::append::{row_keys, KEY_SEPARATOR};
use super::tables::table_name_of;
use super::{commit, conform_for_writer, failpoint, writer_properties, Codec, Lake, TableWriter};

/// The fewest new rows per file when an upsert writes them in parallel: fewer, larger files
/// for small upserts (an hourly run's few thousand rows stay one file).
const MIN_ROWS_PER_FILE: usize = 32_768;

/// Each row's key (None when a key column is NULL) and its `newer_by` value.
type RowKeys = (Vec<Option<String>>, Vec<Option<i64>>);

/// The key of every row of `batch` ([`row_keys`]) and, with `newer_by`, that column as
/// integers (a timestamp, date or number).
fn keys_of(batch: &RecordBatch, keys: &[String], newer_by: Option<&str>) -> Result<RowKeys> {
    let out = row_keys(batch, keys)?;
    let newer = match newer_by {
        None => vec![None; batch.num_rows()],
        Some(n) => {
            let c = batch.column_by_name(n).with_context(|| format!("no column `{n}`"))?;
            let c = match c.data_type() {
                DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64 => {
                    arrow::compute::cast(c, &DataType::Int64)?
                }
                t if t.is_integer() => arrow::compute::cast(c, &DataType::Int64)?,
                t => bail!("newer_by column `{n}` is {t}: a timestamp, date or integer is needed"),
            };
            let c = c.as_primitive::<Int64Type>();
            (0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))).collect()
        }
    };
    Ok((out, newer))
}

/// The part of a data file's name before its first dot: the key of the input that wrote it.
fn key_prefix(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.split_once('.') {
        Some((k, _)) if !k.is_empty() => k.to_string(),
        _ => "rewritten".to_string(),
    }
}

impl Lake {
    /// Upserts `batches` (rows of `schema`) into table `name` on the `keys` columns, as
    /// described in this module; the new rows' files are named after `file_key`. Returns the
    /// new version, or `None` when nothing changed.
    pub async fn upsert_rows(
        &self,
        name: &str,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        keys: &[String],
        newer_by: Option<&str>,
        file_key: &str,
    ) -> Result<Option<i64>> {
        if keys.is_empty() {
            bail!("an upsert into `{name}` needs key columns");
        }
        // Source rows by key: (batch, row, newer_by value).
        let mut source: HashMap<String, (usize, usize, Option<i64>)> = HashMap::new();
        for (b, batch) in batches.iter().enumerate() {
            let (ks, newer) = keys_of(batch, keys, newer_by)?;
            for (r, (k, n)) in ks.into_iter().zip(newer).enumerate() {
                let k = k.with_context(|| format!("a row for `{name}` has a NULL key ({})", keys.join(", ")))?;
                if source.insert(k.clone(), (b, r, n)).is_some() {
                    bail!("the rows for `{name}` hold the key {} twice", k.replace(KEY_SEPARATOR, ", "));
                }
            }
        }
        if source.is_empty() {
            return Ok(None);
        }
        let mut table = self.ensure_table(name, schema, &[]).await?;
        if !table.snapshot()?.metadata().partition_columns().is_empty() {
            bail!("upsert_rows needs an unpartitioned table; `{name}` is partitioned");
        }
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            table.load().await?;
            let files: Vec<(String, u64)> =
                table.snapshot()?.log_data().iter().map(|f| (f.path().to_string(), f.size() as u64)).collect();
            // Which stored rows the source replaces, and which source rows lose to a newer stored row.
            let mut replaced_in: Vec<String> = Vec::new();
            let mut stale_source: HashSet<String> = HashSet::new();
            for (path, size) in &files {
                let mut hit = false;
                let mut stream = self.read_columns(name, path, *size, Some(keys), newer_by).await?;
                while let Some(batch) = stream.next().await {
                    let batch = batch.with_context(|| format!("reading {name}/{path}"))?;
                    let (ks, newer) = keys_of(&batch, keys, newer_by)?;
                    for (k, stored) in ks.iter().zip(newer) {
                        let Some((_, _, new)) = k.as_ref().and_then(|k| source.get(k)) else { continue };
                        if newer_by.is_some() && stored > *new {
                            stale_source.insert(k.clone().unwrap_or_default());
                        } else {
                            hit = true;
                        }
                    }
                }
                if hit {
                    replaced_in.push(path.clone());
                }
            }
            let removed: HashSet<&str> =
                source.keys().filter(|k| !stale_source.contains(*k)).map(String::as_str).collect();
            // The files that held replaced rows, without them.
            let props = || writer_properties(&[], &[], Codec::Zstd);
            let mut writers: HashMap<String, TableWriter> = HashMap::new();
            for path in &replaced_in {
                let size = files.iter().find(|(p, _)| p == path).map_or(0, |f| f.1);
                let prefix = key_prefix(path);
                let mut stream = self.read_columns(name, path, size, None, None).await?;
                while let Some(batch) = stream.next().await {
                    let batch = conform(&batch.with_context(|| format!("reading {name}/{path}"))?, schema)?;
                    let (ks, _) = keys_of(&batch, keys, None)?;
                    let keep: BooleanArray =
                        ks.iter().map(|k| Some(!k.as_deref().is_some_and(|k| removed.contains(k)))).collect();
                    let kept = arrow::compute::filter_record_batch(&batch, &keep)?;
                    if kept.num_rows() > 0 {
                        let w = match writers.entry(prefix.clone()) {
                            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(TableWriter::new(self, name, &prefix, schema, None, props())?)
                            }
                        };
                        w.write(&kept)?;
                    }
                }
            }
            // The source rows, but those a newer stored row outranks.
            let mut keep: Vec<Vec<bool>> = batches.iter().map(|b| vec![true; b.num_rows()]).collect();
            for k in &stale_source {
                if let Some((b, r, _)) = source.get(k) {
                    keep[*b][*r] = false;
                }
            }
            let mut new_rows = Vec::with_capacity(batches.len());
            for (batch, keep) in batches.iter().zip(keep) {
                // String views stay views: the writer takes them as they are.
                let batch = conform_for_writer(schema, batch)?;
                let rows = if keep.iter().all(|k| *k) {
                    batch
                } else {
                    arrow::compute::filter_record_batch(&batch, &BooleanArray::from(keep))?
                };
                if rows.num_rows() > 0 {
                    new_rows.push(rows);
                }
            }
            if new_rows.is_empty() && replaced_in.is_empty() {
                return Ok(None);
            }
            let mut staged = self.write_in_parallel(name, file_key, schema, &new_rows)?;
            for (_, w) in writers {
                staged.extend(w.finish()?);
            }
            self.upload(name, &mut staged).await?;
            let rel: Vec<String> = staged.iter().map(|f| f.rel_path.clone()).collect();
            failpoint(&format!("commit.before:{name}"));
            match commit::replace_files_over_read_version(&table, &replaced_in, staged, "upsert by key".into()).await? {
                Some(v) => {
                    failpoint(&format!("commit.after:{name}"));
                    return Ok(Some(v));
                }
                None if attempt < commit::MAX_COMMIT_ATTEMPTS => {
                    // Another writer committed first: nothing of this landed. Decide again
                    // over the new version (it may have rewritten the same rows).
                    self.delete_unlanded(name, &rel).await;
                    tracing::debug!(table = %table_name_of(&table), attempt, "upsert lost a commit race; upserting again");
                    tokio::time::sleep(commit::backoff(attempt)).await;
                }
                None => bail!("upserting into `{name}`: {attempt} commit races lost in a row; try again"),
            }
        }
    }

    /// Writes `batches` as new files of table `name`, one per core when they are many rows:
    /// encoding and compressing them (titles and bodies, a day's PRs) is otherwise one core's
    /// work after the query's rows are all computed (`swelake bench jobs`: 0.27 s of
    /// pull_requests' 0.62 s).
    fn write_in_parallel(
        &self,
        name: &str,
        file_key: &str,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<Vec<super::StagedFile>> {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let files = (rows / MIN_ROWS_PER_FILE).clamp(1, cores);
        // Consecutive batches, about rows / files each.
        let mut groups: Vec<&[RecordBatch]> = Vec::with_capacity(files);
        let (mut start, mut in_group) = (0, 0);
        for (i, b) in batches.iter().enumerate() {
            in_group += b.num_rows();
            if in_group * files >= rows && groups.len() + 1 < files {
                groups.push(&batches[start..=i]);
                (start, in_group) = (i + 1, 0);
            }
        }
        groups.push(&batches[start..]);
        let props = writer_properties(&[], &[], Codec::Zstd);
        let writers: Vec<TableWriter> = groups
            .iter()
            .map(|_| TableWriter::new(self, name, file_key, schema, None, props.clone()))
            .collect::<Result<_>>()?;
        let written: Vec<Result<Vec<super::StagedFile>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = writers
                .into_iter()
                .zip(groups)
                .map(|(mut w, group)| {
                    scope.spawn(move || {
                        for b in group {
                            w.write(b)?;
                        }
                        w.finish()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread of `{name}` panicked"))))
                .collect()
        });
        let mut staged = Vec::new();
        for w in written {
            staged.extend(w?);
        }
        Ok(staged)
    }

    /// A stream of the columns `keys` and `newer_by` (or all, with `keys` None) of one data
    /// file of table `name`.
    async fn read_columns(
        &self,
        name: &str,
        rel: &str,
        size: u64,
        keys: Option<&[String]>,
        newer_by: Option<&str>,
    ) -> Result<parquet::arrow::async_reader::ParquetRecordBatchStream<StoreFile>> {
        let (store, path) = self.object(&format!("{name}/{rel}"));
        let reader = StoreFile { store, path, size };
        let builder = ParquetRecordBatchStreamBuilder::new(reader)
            .await
            .with_context(|| format!("opening {}", self.display_of(&format!("{name}/{rel}"))))?;
        let builder = match keys {
            None => builder,
            Some(keys) => {
                let arrow_schema = builder.schema().clone();
                let wanted: Vec<&str> = keys.iter().map(String::as_str).chain(newer_by).collect();
                let mut idx = Vec::new();
                for w in &wanted {
                    idx.push(arrow_schema.index_of(w).with_context(|| format!("{name}/{rel} has no column `{w}`"))?);
                }
                let mask = ProjectionMask::roots(builder.parquet_schema(), idx);
                builder.with_projection(mask)
            }
        };
        Ok(builder.with_batch_size(8192).build()?)
    }
}

/// A data file in the lake's store, read by ranges.
struct StoreFile {
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
    size: u64,
}

impl AsyncFileReader for StoreFile {
    fn get_bytes(&mut self, range: std::ops::Range<u64>) -> BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        async move { self.store.get_range(&self.path, range).await.map_err(|e| ParquetError::External(Box::new(e))) }
            .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<std::sync::Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let meta =
                ParquetMetaDataReader::new().with_prefetch_hint(Some(64 << 10)).load_and_finish(self, size).await?;
            Ok(std::sync::Arc::new(meta))
        }
        .boxed()
    }
}

/// `batch` with the columns of `schema`, by name, cast where a file stored another type (a
/// time zone spelled differently, a nullable field).
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c =
                batch.column_by_name(f.name()).with_context(|| format!("a data file has no column `{}`", f.name()))?;
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                Ok(arrow::compute::cast(c, f.data_type())?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
