//! A Parquet file whose columns are encoded and compressed on several threads.
//!
//! Each column of a row group has its own encoder, so encoding them at the same time writes
//! exactly the pages one `ArrowWriter` writes (same dictionary, same page cuts, same bytes):
//! only the time changes. Row groups end where `ArrowWriter` ends them (its row limit), and a
//! batch given as several pieces is concatenated column by column on the encoding threads,
//! so the whole batch is never copied at once.

use std::fs::File;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

/// Leaf (Parquet) columns of one Arrow column, in the order the writer lays them out.
fn leaf_count(t: &DataType) -> usize {
    match t {
        DataType::Struct(fields) => fields.iter().map(|f| leaf_count(f.data_type())).sum(),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => leaf_count(f.data_type()),
        DataType::RunEndEncoded(_, v) => leaf_count(v.data_type()),
        _ => 1,
    }
}

/// One open file written column by column.
pub(super) struct ColumnFile {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// Leaf writers of each top-level column.
    leaves: Vec<usize>,
    /// The row group being written.
    group: Option<Vec<ArrowColumnWriter>>,
    buffered: usize,
    max_rows: usize,
    threads: usize,
}

impl ColumnFile {
    /// `None` where the properties ask for what only `ArrowWriter` does (a byte limit on row
    /// groups, content-defined chunking): the caller writes batch by batch then.
    pub(super) fn try_new(
        file: File,
        schema: SchemaRef,
        props: &WriterProperties,
        threads: usize,
    ) -> Result<std::result::Result<ColumnFile, ArrowWriter<File>>> {
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props.clone()))?;
        if threads < 2 || props.max_row_group_bytes().is_some() || props.content_defined_chunking().is_some() {
            return Ok(Err(writer));
        }
        let leaves: Vec<usize> = schema.fields().iter().map(|f| leaf_count(f.data_type())).collect();
        // The writer's own file writer and factory: its file metadata (the Arrow schema among
        // it) is what a plain ArrowWriter writes.
        let (file, factory) = writer.into_serialized_writer()?;
        if leaves.iter().sum::<usize>() != file.schema_descr().num_columns() {
            bail!(
                "the Parquet schema has {} leaf columns, the Arrow schema {leaves:?}",
                file.schema_descr().num_columns()
            );
        }
        Ok(Ok(ColumnFile {
            file,
            factory,
            schema,
            leaves,
            group: None,
            buffered: 0,
            max_rows: props.max_row_group_row_count().unwrap_or(usize::MAX),
            threads,
        }))
    }

    /// Writes the rows of `pieces` (batches of the file's schema) as if they were one batch.
    pub(super) fn write(&mut self, pieces: &[RecordBatch]) -> Result<()> {
        let mut pieces: Vec<RecordBatch> = pieces.iter().filter(|p| p.num_rows() > 0).cloned().collect();
        let mut rows: usize = pieces.iter().map(RecordBatch::num_rows).sum();
        while rows > 0 {
            let room = self.max_rows - self.buffered;
            let (now, later) = if rows > room { split_rows(&pieces, room) } else { (pieces, Vec::new()) };
            let n: usize = now.iter().map(RecordBatch::num_rows).sum();
            self.encode(&now)?;
            if self.buffered >= self.max_rows {
                self.flush()?;
            }
            rows -= n;
            pieces = later;
        }
        Ok(())
    }

    fn encode(&mut self, pieces: &[RecordBatch]) -> Result<()> {
        if self.group.is_none() {
            self.group = Some(self.factory.create_column_writers(self.file.flushed_row_groups().len())?);
        }
        let writers = self.group.as_mut().expect("created above");
        let mut columns: Vec<Column<'_>> = Vec::with_capacity(self.leaves.len());
        let mut rest = writers.as_mut_slice();
        for (i, n) in self.leaves.iter().enumerate() {
            let (mine, after) = rest.split_at_mut(*n);
            rest = after;
            let arrays: Vec<ArrayRef> = pieces.iter().map(|p| p.column(i).clone()).collect();
            let bytes = arrays.iter().map(|a| a.get_buffer_memory_size()).sum();
            columns.push(Column { field: self.schema.field(i), arrays, writers: mine, bytes });
        }
        in_bins(columns, self.threads, |c| c.bytes, encode_column)?;
        self.buffered += pieces.iter().map(RecordBatch::num_rows).sum::<usize>();
        Ok(())
    }

    /// Closes the row group being written (its last pages compressed on the threads too).
    fn flush(&mut self) -> Result<()> {
        let Some(writers) = self.group.take() else { return Ok(()) };
        let n = writers.len();
        let closing: Vec<(usize, ArrowColumnWriter)> = writers.into_iter().enumerate().collect();
        let closed: std::sync::Mutex<Vec<Option<ArrowColumnChunk>>> =
            std::sync::Mutex::new((0..n).map(|_| None).collect());
        in_bins(
            closing,
            self.threads,
            |(_, w)| w.memory_size(),
            |(i, w)| {
                let chunk = w.close()?;
                closed.lock().map_err(|_| anyhow::anyhow!("a column thread panicked"))?[i] = Some(chunk);
                Ok(())
            },
        )?;
        let chunks = closed.into_inner().map_err(|_| anyhow::anyhow!("a column thread panicked"))?;
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.context("a column was not closed")?.append_to_row_group(&mut group)?;
        }
        group.close()?;
        self.buffered = 0;
        Ok(())
    }

    pub(super) fn close(mut self) -> Result<ParquetMetaData> {
        self.flush()?;
        Ok(self.file.close()?)
    }
}

struct Column<'a> {
    field: &'a arrow::datatypes::Field,
    arrays: Vec<ArrayRef>,
    writers: &'a mut [ArrowColumnWriter],
    bytes: usize,
}

fn encode_column(c: Column<'_>) -> Result<()> {
    let array = match c.arrays.as_slice() {
        [one] => one.clone(),
        many => arrow::compute::concat(&many.iter().map(|a| a.as_ref()).collect::<Vec<_>>())?,
    };
    drop(c.arrays);
    let leaves = compute_leaves(c.field, &array)?;
    if leaves.len() != c.writers.len() {
        bail!("column {} has {} leaves, {} writers", c.field.name(), leaves.len(), c.writers.len());
    }
    for (leaf, w) in leaves.iter().zip(c.writers.iter_mut()) {
        w.write(leaf)?;
    }
    Ok(())
}

/// Runs `work` on every item, the items spread over `threads` threads (this one among them)
/// by `weight`, heaviest first onto the least loaded thread. The first error is returned.
fn in_bins<T: Send>(
    items: Vec<T>,
    threads: usize,
    weight: impl Fn(&T) -> usize,
    work: impl Fn(T) -> Result<()> + Sync,
) -> Result<()> {
    let mut weighted: Vec<(usize, T)> = items.into_iter().map(|t| (weight(&t), t)).collect();
    weighted.sort_by_key(|(w, _)| std::cmp::Reverse(*w));
    let threads = threads.clamp(1, weighted.len().max(1));
    let mut bins: Vec<(usize, Vec<T>)> = (0..threads).map(|_| (0, Vec::new())).collect();
    for (w, t) in weighted {
        let lightest = bins.iter_mut().min_by_key(|(load, _)| *load).expect("at least one bin");
        lightest.0 += w;
        lightest.1.push(t);
    }
    let work = &work;
    std::thread::scope(|s| {
        let mut bins = bins.into_iter();
        let here = bins.next().map(|(_, b)| b).unwrap_or_default();
        let others: Vec<_> = bins.map(|(_, bin)| s.spawn(move || bin.into_iter().try_for_each(work))).collect();
        let mut result = here.into_iter().try_for_each(work);
        for h in others {
            let r = h.join().map_err(|_| anyhow::anyhow!("a column encoding thread panicked")).and_then(|r| r);
            result = result.and(r);
        }
        result
    })
}

/// `pieces` cut after `rows` rows: (the first rows, the rest).
fn split_rows(pieces: &[RecordBatch], rows: usize) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
    let (mut head, mut tail, mut left) = (Vec::new(), Vec::new(), rows);
    for p in pieces {
        let n = p.num_rows();
        if left >= n {
            head.push(p.clone());
            left -= n;
        } else if left == 0 {
            tail.push(p.clone());
        } else {
            head.push(p.slice(0, left));
            tail.push(p.slice(left, n - left));
            left = 0;
        }
    }
    (head, tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, ListBuilder, StringArray, StringBuilder, StructArray};
    use arrow::datatypes::{Field, Fields, Schema};
    use std::sync::Arc;

    fn batch(schema: &SchemaRef, from: i64, n: usize) -> RecordBatch {
        let ids = Int64Array::from_iter((from..from + n as i64).map(|i| (i % 7 != 3).then_some(i)));
        let text = StringArray::from_iter_values(
            (0..n).map(|i| format!("{} {}", (from as usize + i) % 13, "x".repeat(i % 300))),
        );
        let mut list = ListBuilder::new(StringBuilder::new());
        for i in 0..n {
            for j in 0..(i % 4) {
                list.values().append_value(format!("v{}", (i + j) % 5));
            }
            list.append(i % 9 != 0);
        }
        let s = StructArray::from(vec![
            (Arc::new(Field::new("a", DataType::Int64, true)), Arc::new(ids.clone()) as ArrayRef),
            (Arc::new(Field::new("b", DataType::Utf8, true)), Arc::new(text.clone()) as ArrayRef),
        ]);
        RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(text), Arc::new(list.finish()), Arc::new(s)])
            .unwrap()
    }

    /// The same rows written by ArrowWriter and by threads, in any pieces, make the same file
    /// bytes, row groups cut inside pieces included.
    #[test]
    fn threads_write_the_bytes_arrow_writer_writes() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("text", DataType::Utf8, true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
            Field::new(
                "s",
                DataType::Struct(Fields::from(vec![
                    Field::new("a", DataType::Int64, true),
                    Field::new("b", DataType::Utf8, true),
                ])),
                true,
            ),
        ]));
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(5000))
            .set_data_page_size_limit(4096)
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .build();
        let batches: Vec<RecordBatch> =
            [(0, 3000), (3000, 1), (3001, 4500), (7501, 2600)].iter().map(|(f, n)| batch(&schema, *f, *n)).collect();
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.parquet");
        let mut w = ArrowWriter::try_new(File::create(&plain).unwrap(), schema.clone(), Some(props.clone())).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.close().unwrap();
        let want = std::fs::read(&plain).unwrap();
        for threads in [2, 3] {
            let path = dir.path().join(format!("t{threads}.parquet"));
            let mut f =
                match ColumnFile::try_new(File::create(&path).unwrap(), schema.clone(), &props, threads).unwrap() {
                    Ok(f) => f,
                    Err(_) => panic!("threads > 1 writes by columns"),
                };
            // Each batch in pieces: the pieces of one write are one batch to the encoder.
            for b in &batches {
                let n = b.num_rows();
                let cuts = [0, n / 3, n / 3, n * 2 / 3, n];
                let pieces: Vec<_> = cuts.windows(2).map(|w| b.slice(w[0], w[1] - w[0])).collect();
                f.write(&pieces).unwrap();
            }
            let meta = f.close().unwrap();
            assert_eq!(meta.num_row_groups(), 3, "5000-row groups of 10101 rows");
            assert!(std::fs::read(&path).unwrap() == want, "{threads} threads: other bytes than ArrowWriter's");
        }
    }
}
