//! Writing a table's Parquet files: one open file per partition value, named after the key of
//! the input that produced it, with Delta's per-column statistics for the add action.
//!
//! For a local lake the files go straight into the table's directory; for an object-store
//! lake they are written to a local staging directory and uploaded when committed (see
//! `Lake::replace_keys`), so a writer never holds a whole file in memory.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use deltalake::kernel::Add;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;
use serde_json::{json, Value};

use super::columns::ColumnFile;
use super::Lake;

/// A Parquet file written into a table directory but not yet committed.
#[derive(Debug, Clone)]
pub struct StagedFile {
    /// Path relative to the table root, as recorded in the Delta log.
    pub rel_path: String,
    pub partition_values: HashMap<String, Option<String>>,
    pub size: i64,
    pub num_records: i64,
    /// Per-column statistics of the file (see [`column_stats`]).
    pub stats: ColumnStats,
    /// Where the file waits for upload, for an object-store lake (`None`: it is already in
    /// the table's directory).
    pub local: Option<PathBuf>,
}

impl StagedFile {
    pub(crate) fn into_add(self) -> Add {
        Add {
            path: self.rel_path,
            partition_values: self.partition_values,
            size: self.size,
            modification_time: chrono::Utc::now().timestamp_millis(),
            data_change: true,
            stats: Some(self.stats.to_json(self.num_records)),
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

/// Writes record batches of one table into Parquet files under the table directory, one
/// open file per partition value, named `{key}.{uuid}.parquet`.
pub struct TableWriter {
    /// Where the files are written: the table's directory of a local lake, a staging
    /// directory for an object-store lake (uploaded on commit).
    table_dir: PathBuf,
    /// Set for staged files (an object-store lake).
    staged: bool,
    key: String,
    file_schema: SchemaRef,
    /// Index of the partition column in incoming batches (dropped from the file data).
    partition: Option<(usize, String)>,
    props: WriterProperties,
    open: HashMap<String, (OpenFile, String, i64)>,
    done: Vec<StagedFile>,
    /// Name files after their partition value instead of `key` (jobs that replace whole
    /// partitions use the partition value as the key).
    key_by_partition: bool,
    /// Threads that encode a file's columns (1: the Arrow writer, batch by batch).
    encode_threads: usize,
}

/// A file being written: by the Arrow writer, or column by column on several threads (the
/// same bytes either way).
enum OpenFile {
    Batches(ArrowWriter<File>),
    Columns(ColumnFile),
}

impl OpenFile {
    fn write(&mut self, pieces: &[RecordBatch]) -> Result<()> {
        match self {
            OpenFile::Columns(f) => f.write(pieces),
            OpenFile::Batches(w) => {
                match pieces {
                    [] => {}
                    [one] => w.write(one)?,
                    many => w.write(&arrow::compute::concat_batches(&many[0].schema(), many)?)?,
                }
                Ok(())
            }
        }
    }

    fn close(self) -> Result<ParquetMetaData> {
        match self {
            OpenFile::Columns(f) => f.close(),
            OpenFile::Batches(w) => Ok(w.close()?),
        }
    }
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
        let (table_dir, staged) = lake.writer_dir(table);
        Self::in_dir(table_dir, staged, key, schema, partition_col, props)
    }

    /// A writer into `table_dir` (the table's own directory, or with `staged` a local
    /// directory whose files are uploaded to the table's place in a store): what a Ballista
    /// executor writes a job's output with.
    pub fn in_dir(
        table_dir: PathBuf,
        staged: bool,
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
            table_dir,
            staged,
            key: key.to_string(),
            file_schema: Arc::new(Schema::new(fields)),
            partition,
            props,
            open: HashMap::new(),
            done: Vec::new(),
            key_by_partition: false,
            encode_threads: 1,
        })
    }

    /// Encodes each file's columns on `threads` threads: the same files, sooner where a
    /// core would otherwise wait (ingest's merge thread on two cores).
    pub fn encode_threads(mut self, threads: usize) -> Self {
        self.encode_threads = threads.max(1);
        self
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
            arrow::datatypes::DataType::Utf8View => {
                let a = col.as_string_view();
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

    /// Writes the rows of `pieces` (batches of the table's schema, in order) as one batch
    /// made of them would be written, without making that batch: with encoding threads, each
    /// column is put together on the thread that encodes it.
    pub fn write_pieces(&mut self, pieces: &[RecordBatch]) -> Result<()> {
        let pieces: Vec<&RecordBatch> = pieces.iter().filter(|p| p.num_rows() > 0).collect();
        let Some(first) = pieces.first() else { return Ok(()) };
        let Some((idx, _)) = self.partition.clone() else {
            return self.write_pieces_to(String::new(), pieces.into_iter().cloned().collect());
        };
        // One partition value in every piece: the pieces go to one file as they are.
        if pieces.iter().all(|p| self.single_partition(p)) {
            let value = self.partition_values(&first.slice(0, 1))?.remove(0);
            let mut same = true;
            for p in &pieces[1..] {
                same &= self.partition_values(&p.slice(0, 1))?.remove(0) == value;
            }
            if same {
                let keep: Vec<usize> = (0..first.num_columns()).filter(|i| *i != idx).collect();
                let data = pieces.iter().map(|p| p.project(&keep)).collect::<Result<Vec<_>, _>>()?;
                return self.write_pieces_to(value, data);
            }
        }
        self.write(&arrow::compute::concat_batches(&first.schema(), pieces)?)
    }

    fn write_to(&mut self, value: String, data: RecordBatch) -> Result<()> {
        self.write_pieces_to(value, vec![data])
    }

    fn write_pieces_to(&mut self, value: String, data: Vec<RecordBatch>) -> Result<()> {
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
            let writer = match ColumnFile::try_new(file, self.file_schema.clone(), &self.props, self.encode_threads)? {
                Ok(columns) => OpenFile::Columns(columns),
                Err(batches) => OpenFile::Batches(batches),
            };
            self.open.insert(value.clone(), (writer, rel, 0));
        }
        let (writer, _, rows) = self.open.get_mut(&value).expect("inserted above");
        writer.write(&data)?;
        *rows += data.iter().map(|b| b.num_rows() as i64).sum::<i64>();
        Ok(())
    }

    /// Closes every file and returns them for commit.
    pub fn finish(mut self) -> Result<Vec<StagedFile>> {
        let mut open: Vec<_> = self.open.drain().collect();
        open.sort_by(|a, b| a.0.cmp(&b.0));
        for (value, (writer, rel, rows)) in open {
            let meta = writer.close()?;
            let local = self.table_dir.join(&rel);
            let size = std::fs::metadata(&local)?.len() as i64;
            let mut partition_values = HashMap::new();
            if let Some((_, col)) = &self.partition {
                partition_values.insert(col.clone(), Some(value));
            }
            self.done.push(StagedFile {
                rel_path: rel,
                partition_values,
                size,
                num_records: rows,
                stats: column_stats(&meta, &self.file_schema),
                local: self.staged.then_some(local),
            });
        }
        Ok(self.done)
    }
}

/// Per-column `minValues`, `maxValues` and `nullCount` of one file, as Delta records them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColumnStats {
    pub min: BTreeMap<String, Value>,
    pub max: BTreeMap<String, Value>,
    pub null_count: BTreeMap<String, u64>,
}

impl ColumnStats {
    /// The `stats` JSON of an add action.
    pub fn to_json(&self, num_records: i64) -> String {
        let mut o = serde_json::Map::new();
        o.insert("numRecords".into(), json!(num_records));
        if !self.min.is_empty() {
            o.insert("minValues".into(), json!(self.min));
        }
        if !self.max.is_empty() {
            o.insert("maxValues".into(), json!(self.max));
        }
        if !self.null_count.is_empty() {
            o.insert("nullCount".into(), json!(self.null_count));
        }
        Value::Object(o).to_string()
    }
}

impl ColumnStats {
    /// Reads back the `stats` JSON of an add action ([`ColumnStats::to_json`]): its
    /// statistics and `numRecords`.
    pub fn from_json(text: &str) -> Result<(i64, ColumnStats)> {
        let v: Value = serde_json::from_str(text).context("file statistics are not JSON")?;
        let num_records = v.get("numRecords").and_then(Value::as_i64).context("file statistics without numRecords")?;
        let map = |key: &str| -> BTreeMap<String, Value> {
            v.get(key).and_then(Value::as_object).map(|o| o.clone().into_iter().collect()).unwrap_or_default()
        };
        let null_count =
            map("nullCount").into_iter().filter_map(|(k, n)| n.as_u64().map(|n| (k, n))).collect::<BTreeMap<_, _>>();
        Ok((num_records, ColumnStats { min: map("minValues"), max: map("maxValues"), null_count }))
    }
}

/// Whether an array of type `have` is written by [`TableWriter`] into a column of type `want`
/// as it is: the Parquet writer encodes string and binary views into the same `BYTE_ARRAY`
/// pages as plain strings and binaries, so copying them into plain arrays first only costs
/// (`swelake bench jobs`: the cast was a tenth of pr_timeline's CPU). Views inside lists are
/// not: the writer checks nested types exactly.
pub fn written_as(have: &DataType, want: &DataType) -> bool {
    have == want
        || matches!((have, want), (DataType::Utf8View, DataType::Utf8) | (DataType::BinaryView, DataType::Binary))
}

/// [`conform`] for a [`TableWriter`]: the same checks and casts, except that string and
/// binary views stay views ([`written_as`]); the batch's schema says so, the file's is the
/// table's.
pub fn conform_for_writer(schema: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    conform_with(schema, batch, written_as)
}

/// `batch` in a table's layout: columns cast where the query's type differs (a time zone
/// spelled differently), nullability the table's (a NULL in a non-nullable column, a key, is
/// an error, not a row).
pub fn conform(schema: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    conform_with(schema, batch, |have, want| have == want)
}

/// Casts each column of `batch` to the table's type unless `keep(its type, the table's)`,
/// under the table's names and nullability.
fn conform_with(
    schema: &SchemaRef,
    batch: &RecordBatch,
    keep: fn(&DataType, &DataType) -> bool,
) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        bail!("a batch of {} columns for a table of {}", batch.num_columns(), schema.fields().len());
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (c, f) in batch.columns().iter().zip(schema.fields()) {
        if keep(c.data_type(), f.data_type()) {
            fields.push(f.as_ref().clone().with_data_type(c.data_type().clone()));
            columns.push(c.clone());
        } else {
            fields.push(f.as_ref().clone());
            columns.push(
                arrow::compute::cast(c, f.data_type())
                    .with_context(|| format!("column `{}`: {} into {}", f.name(), c.data_type(), f.data_type()))?,
            );
        }
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Strings longer than this get no maximum (Delta's convention: a truncated maximum would be
/// smaller than the value) and a truncated minimum.
const STRING_STATS_CHARS: usize = 32;

/// The statistics of a written file's top-level scalar columns, from its Parquet footer:
/// the columns readers filter on (dates, times, repository names, numbers). Columns written
/// without statistics (long text) and nested columns get none.
pub fn column_stats(meta: &ParquetMetaData, schema: &Schema) -> ColumnStats {
    let mut out = ColumnStats::default();
    let descr = meta.file_metadata().schema_descr();
    for (field_index, field) in schema.fields().iter().enumerate() {
        if field.data_type().is_nested() {
            continue;
        }
        // Top-level scalars are leaves in field order, before any nested column's leaves.
        let Some(leaf) = (0..descr.num_columns()).find(|&i| descr.column(i).path().parts() == [field.name().as_str()])
        else {
            continue;
        };
        let _ = field_index;
        let mut nulls: Option<u64> = Some(0);
        let (mut min, mut max): (Option<Value>, Option<Value>) = (None, None);
        let mut complete = true;
        for rg in meta.row_groups() {
            let Some(st) = rg.column(leaf).statistics() else {
                complete = false;
                nulls = None;
                break;
            };
            nulls = nulls.zip(st.null_count_opt()).map(|(a, b)| a + b);
            match (json_of(st, field.data_type(), true), json_of(st, field.data_type(), false)) {
                (Some(lo), Some(hi)) => {
                    min = Some(match min {
                        Some(m) if less(&m, &lo) => m,
                        _ => lo,
                    });
                    max = Some(match max {
                        Some(m) if less(&hi, &m) => m,
                        _ => hi,
                    });
                }
                // A row group of only NULLs has no min/max; others still bound the file.
                _ if st.null_count_opt() == Some(rg.num_rows() as u64) => {}
                _ => complete = false,
            }
        }
        if let Some(n) = nulls {
            out.null_count.insert(field.name().clone(), n);
        }
        if complete {
            if let Some(m) = min {
                out.min.insert(field.name().clone(), m);
            }
            if let Some(m) = max.filter(|m| m.as_str().is_none_or(|s| s.chars().count() <= STRING_STATS_CHARS)) {
                out.max.insert(field.name().clone(), m);
            }
        }
    }
    out
}

/// Orders two statistics values of one column.
fn less(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() < y.as_f64(),
        (Value::String(x), Value::String(y)) => x < y,
        (Value::Bool(x), Value::Bool(y)) => !x & y,
        _ => false,
    }
}

/// The minimum (`lo`) or maximum of a column chunk's statistics as Delta's JSON value.
fn json_of(st: &Statistics, t: &DataType, lo: bool) -> Option<Value> {
    let micros_text = |us: i64, lo: bool| {
        // Delta keeps milliseconds: round the minimum down and the maximum up, so the range
        // still holds every value.
        let ms = if lo { us.div_euclid(1000) } else { (us + 999).div_euclid(1000) };
        chrono::DateTime::from_timestamp_millis(ms).map(|d| json!(d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()))
    };
    match (st, t) {
        (Statistics::Boolean(s), DataType::Boolean) => (if lo { s.min_opt() } else { s.max_opt() }).map(|v| json!(v)),
        (Statistics::Int32(s), DataType::Int32 | DataType::Int16 | DataType::Int8) => {
            (if lo { s.min_opt() } else { s.max_opt() }).map(|v| json!(v))
        }
        (Statistics::Int32(s), DataType::Date32) => (if lo { s.min_opt() } else { s.max_opt() })
            .and_then(|d| chrono::DateTime::from_timestamp(i64::from(*d) * 86_400, 0))
            .map(|d| json!(d.format("%Y-%m-%d").to_string())),
        (Statistics::Int64(s), DataType::Int64) => (if lo { s.min_opt() } else { s.max_opt() }).map(|v| json!(v)),
        (Statistics::Int64(s), DataType::Timestamp(TimeUnit::Microsecond, _)) => {
            (if lo { s.min_opt() } else { s.max_opt() }).and_then(|v| micros_text(*v, lo))
        }
        (Statistics::Float(s), DataType::Float32) => {
            (if lo { s.min_opt() } else { s.max_opt() }).filter(|v| v.is_finite()).map(|v| json!(v))
        }
        (Statistics::Double(s), DataType::Float64) => {
            (if lo { s.min_opt() } else { s.max_opt() }).filter(|v| v.is_finite()).map(|v| json!(v))
        }
        (Statistics::ByteArray(s), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
            let v = if lo { s.min_opt() } else { s.max_opt() }?;
            let text = std::str::from_utf8(v.data()).ok()?;
            let text = if lo { text.chars().take(STRING_STATS_CHARS).collect() } else { text.to_string() };
            Some(json!(text))
        }
        _ => None,
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

    #[test]
    fn string_views_are_written_as_the_tables_strings() {
        use arrow::array::{Date32Array, ListArray, StringViewArray};
        use arrow::datatypes::Int32Type;
        let item = Arc::new(Field::new_list_field(DataType::Utf8, true));
        let table = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("labels", DataType::List(item), true),
            Field::new("day", DataType::Date32, false),
        ]));
        let long = "a string longer than twelve bytes, kept out of line in a view".to_string();
        let query = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8View, true),
            Field::new("labels", DataType::List(Arc::new(Field::new_list_field(DataType::Utf8View, true))), true),
            Field::new("day", DataType::Date32, true),
        ]));
        let labels = ListArray::from_iter_primitive::<Int32Type, _, _>([Some(vec![Some(1)]), None]);
        let labels = arrow::compute::cast(&labels, query.field(1).data_type()).unwrap();
        let batch = RecordBatch::try_new(
            query,
            vec![
                Arc::new(StringViewArray::from(vec!["k", long.as_str()])),
                labels,
                Arc::new(Date32Array::from(vec![20_000, 20_000])),
            ],
        )
        .unwrap();
        let conformed = conform_for_writer(&table, &batch).unwrap();
        // The top-level view stays a view; the list is cast (the writer checks nested types).
        assert_eq!(conformed.schema().field(0).data_type(), &DataType::Utf8View);
        assert!(!conformed.schema().field(0).is_nullable());
        assert_eq!(conformed.schema().field(1).data_type(), table.field(1).data_type());

        let dir = tempfile::tempdir().unwrap();
        let props = writer_properties(&[], &["key"], Codec::Zstd);
        let mut w = TableWriter::in_dir(dir.path().to_path_buf(), false, "k", &table, Some("day"), props).unwrap();
        w.write(&conformed).unwrap();
        let files = w.finish().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].num_records, 2);
        let file = File::open(dir.path().join(&files[0].rel_path)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        // The file says what the table says: plain strings, for every reader.
        assert_eq!(reader.schema().field(0).data_type(), &DataType::Utf8);
        let back: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        let keys = back[0].column(0).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((keys.value(0), keys.value(1)), ("k", long.as_str()));
        assert_eq!(back[0].column(1).as_any().downcast_ref::<ListArray>().unwrap().value(0).len(), 1);

        // A NULL key is still an error, not a row.
        let nulls = RecordBatch::try_new(
            batch.schema(),
            vec![
                Arc::new(StringViewArray::from(vec![None, Some("x")])),
                batch.column(1).clone(),
                batch.column(2).clone(),
            ],
        )
        .unwrap();
        assert!(conform_for_writer(&table, &nulls).is_err());
    }
}
