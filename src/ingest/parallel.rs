//! One hour file parsed on several threads, with the result of parsing it on one.
//!
//! An hour file is a single gzip stream, so it is decompressed in order (on a thread of its
//! own, [`super::reader::ReadAhead`]) and split into lines in order (here); runs of complete
//! lines go to `workers` threads that parse them into Arrow batches, clustered as
//! [`ClusteredEvents`] clusters them; one thread takes the parsed runs back *in file order*,
//! drops events whose id appeared earlier in the file (a `duplicate_id` rejection, as before:
//! the first occurrence in the file is kept), and writes the batches. Whatever the number of
//! workers, the same runs are parsed and merged in the same order, so the files written are
//! the same.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch};

use super::batch::ClusteredEvents;
use super::event::{parse_line, Rejection};
use super::reader::{Line, LineReader};
use crate::lake::{StagedFile, TableWriter};

/// Complete lines of the file, copied out of the decoder's buffers.
pub(super) struct Run {
    seq: u64,
    buf: Vec<u8>,
    /// (line number in the file, start, end) of each line in `buf`.
    lines: Vec<(u64, usize, usize)>,
}

/// Lines per run, and bytes: a run is one parsing task.
const RUN_LINES: usize = 4096;
const RUN_BYTES: usize = 4 << 20;
/// Payload bytes (plus 256 an event) after which held events are written.
const HELD_BYTES: usize = 48 << 20;

/// A rejected line: what `events_rejected` records about it.
pub(super) struct Rejected {
    pub line: u64,
    pub rejection: Rejection,
    pub raw: String,
    pub total: usize,
}

/// A parsed run: its events as clustered batches (cluster index, batch), its rejections.
struct ParsedRun {
    seq: u64,
    batches: Vec<(usize, RecordBatch)>,
    rejected: Vec<Rejected>,
    run: Run,
}

/// What the merge thread hands back.
pub(super) struct Merged {
    pub events: Vec<StagedFile>,
    pub events_written: u64,
    pub by_type: rustc_hash::FxHashMap<Box<str>, u64>,
    pub distinct_repos: u64,
    /// Duplicate-id rejections (the workers' and the reader's come separately).
    pub rejected: Vec<Rejected>,
}

pub(super) fn lossy_prefix(bytes: &[u8], keep: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(keep)]).into_owned()
}

/// Parses one complete line into `builder`, or into a rejection; an event is kept only if
/// `keep` says so (the one-thread path drops a repeated id there).
fn parse_one(
    bytes: &[u8],
    line: u64,
    builder: &mut ClusteredEvents,
    source_file: &str,
    raw_keep: usize,
    rejected: &mut Vec<Rejected>,
    keep: impl FnOnce(&super::event::Event<'_>) -> bool,
) {
    let mut reject = |r: Rejection| {
        rejected.push(Rejected { line, rejection: r, raw: lossy_prefix(bytes, raw_keep), total: bytes.len() })
    };
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        reject(Rejection::new("empty_line", "the line is blank"));
        return;
    }
    match std::str::from_utf8(bytes) {
        Err(e) => reject(Rejection::new("invalid_utf8", format!("invalid UTF-8 at byte {}", e.valid_up_to()))),
        Ok(text) => match parse_line(text) {
            Ok(ev) => {
                if keep(&ev) {
                    builder.push(&ev, source_file, line)
                }
            }
            Err(r) => reject(r),
        },
    }
}

/// Parses the lines of one run (on a worker thread).
fn parse_run(run: Run, builder: &mut ClusteredEvents, source_file: &str, raw_keep: usize) -> ParsedRun {
    let mut rejected = Vec::new();
    for &(line, start, end) in &run.lines {
        parse_one(&run.buf[start..end], line, builder, source_file, raw_keep, &mut rejected, |_| true);
    }
    ParsedRun { seq: run.seq, batches: builder.finish_groups(), rejected, run }
}

/// Event ids seen in one file. GitHub's ids are decimal numbers, kept as u64 (no allocation
/// per event); anything else is kept as a string.
#[derive(Default)]
struct SeenIds {
    numeric: rustc_hash::FxHashSet<u64>,
    other: std::collections::HashSet<Box<str>>,
}

impl SeenIds {
    /// Records `id`; false if it was already there.
    fn insert(&mut self, id: &str) -> bool {
        let numeric = id.len() <= 19 && !id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit());
        match id.parse::<u64>() {
            Ok(n) if numeric => self.numeric.insert(n),
            _ => self.other.insert(Box::from(id)),
        }
    }
}

/// Takes parsed runs in file order, keeps each event id's first occurrence, and writes
/// batches of about `batch_rows` rows (or 48 MB of payloads), cluster by cluster.
struct Merger {
    writer: TableWriter,
    batch_rows: usize,
    seen: SeenIds,
    repos: rustc_hash::FxHashSet<u64>,
    by_type: rustc_hash::FxHashMap<Box<str>, u64>,
    /// Held batches of each cluster, written in cluster order once enough are held.
    held: [Vec<RecordBatch>; 4],
    held_rows: usize,
    held_bytes: usize,
    written: u64,
    rejected: Vec<Rejected>,
    raw_keep: usize,
}

impl Merger {
    fn take(&mut self, p: ParsedRun) -> Result<()> {
        // Every event of the run in file order: (line, batch index, row).
        let mut order: Vec<(u64, usize, usize)> = Vec::new();
        for (b, (_, batch)) in p.batches.iter().enumerate() {
            let lines: &Int64Array =
                batch.column_by_name("source_line").context("events batch without source_line")?.as_primitive();
            order.extend(lines.values().iter().enumerate().map(|(r, l)| (*l as u64, b, r)));
        }
        order.sort_unstable();
        let text = |batch: &RecordBatch, name: &str| -> Result<arrow::array::StringArray> {
            let col = batch.column_by_name(name).with_context(|| format!("events batch without {name}"))?;
            Ok(col.as_string::<i32>().clone())
        };
        let cols: Vec<_> = p
            .batches
            .iter()
            .map(|(_, b)| Ok((text(b, "id")?, text(b, "type")?, text(b, "repo_name")?)))
            .collect::<Result<_>>()?;
        let mut keep: Vec<Option<Vec<bool>>> = vec![None; p.batches.len()];
        for &(line, b, r) in &order {
            let batch = &p.batches[b].1;
            let (ids, kinds, repo) = &cols[b];
            let id = ids.value(r);
            if self.seen.insert(id) {
                self.kept(kinds.value(r), repo.is_valid(r).then(|| repo.value(r)));
            } else {
                let raw = match p.run.lines.binary_search_by_key(&line, |l| l.0) {
                    Ok(i) => &p.run.buf[p.run.lines[i].1..p.run.lines[i].2],
                    Err(_) => &[][..],
                };
                self.rejected.push(Rejected {
                    line,
                    rejection: Rejection::new(
                        "duplicate_id",
                        format!("event id {id} already appeared earlier in this file"),
                    ),
                    raw: lossy_prefix(raw, self.raw_keep),
                    total: raw.len(),
                });
                keep[b].get_or_insert_with(|| vec![true; batch.num_rows()])[r] = false;
            }
        }
        let mut batches = Vec::with_capacity(p.batches.len());
        for ((group, batch), keep) in p.batches.into_iter().zip(keep) {
            batches.push(match keep {
                None => (group, batch),
                Some(mask) => (group, arrow::compute::filter_record_batch(&batch, &BooleanArray::from(mask))?),
            });
        }
        self.hold(batches)
    }

    /// Counts a kept event.
    fn kept(&mut self, kind: &str, repo: Option<&str>) {
        match self.by_type.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                self.by_type.insert(Box::from(kind), 1);
            }
        }
        if let Some(repo) = repo {
            self.repos.insert(crate::hash::fnv1a(repo.bytes(), crate::hash::OFFSET));
        }
        self.written += 1;
    }

    /// Holds a run's batches (its duplicates already dropped) and writes what is held as soon
    /// as it is a batch's worth: `batch_rows` events or 48 MB of payloads, counted event by
    /// event in file order, so the batches written end where a single reader building them
    /// line by line would end them (the clusters, and so the files, are the same).
    fn hold(&mut self, mut batches: Vec<(usize, RecordBatch)>) -> Result<()> {
        batches.retain(|(_, b)| b.num_rows() > 0);
        while !batches.is_empty() {
            // (line, payload bytes) of every event, in file order.
            let mut rows: Vec<(i64, usize)> = Vec::new();
            for (_, b) in &batches {
                let lines: &Int64Array = b.column_by_name("source_line").context("no source_line")?.as_primitive();
                let payload = b.column_by_name("payload").context("no payload")?.as_string::<i32>();
                let offsets = payload.value_offsets();
                rows.extend(
                    lines.values().iter().zip(offsets.windows(2)).map(|(l, o)| (*l, (o[1] - o[0]) as usize + 256)),
                );
            }
            rows.sort_unstable();
            let (mut n, mut bytes, mut cut) = (self.held_rows, self.held_bytes, None);
            for (line, b) in &rows {
                (n, bytes) = (n + 1, bytes + b);
                if n >= self.batch_rows || bytes >= HELD_BYTES {
                    cut = Some(*line);
                    break;
                }
            }
            let Some(cut) = cut else {
                (self.held_rows, self.held_bytes) = (n, bytes);
                for (group, batch) in batches {
                    self.held[group].push(batch);
                }
                return Ok(());
            };
            let mut rest = Vec::new();
            for (group, batch) in batches {
                let lines: &Int64Array = batch.column_by_name("source_line").context("no source_line")?.as_primitive();
                let k = lines.values().partition_point(|l| *l <= cut);
                if k > 0 {
                    self.held[group].push(batch.slice(0, k));
                }
                if k < batch.num_rows() {
                    rest.push((group, batch.slice(k, batch.num_rows() - k)));
                }
            }
            self.flush()?;
            batches = rest;
        }
        Ok(())
    }

    /// Writes each cluster's held events as one batch (put together column by column on the
    /// encoding threads): the Parquet writer cuts its pages where the batches it is given
    /// end, and pieces of runs would cut them elsewhere than one batch per cluster does
    /// (`bench ingest`: 5% larger files).
    fn flush(&mut self) -> Result<()> {
        for group in self.held.iter_mut() {
            self.writer.write_pieces(group)?;
            group.clear();
        }
        self.held_rows = 0;
        self.held_bytes = 0;
        Ok(())
    }
}

/// Streams `lines` through `workers` parsing threads into `writer`. `on_line` sees every line
/// as it is read and turns those the reader itself rejects (over the length limit, a broken
/// stream) into rejections. Returns what was merged, the reader's rejections and the number
/// of lines.
pub(super) fn parse_lines<R: std::io::BufRead>(
    lines: &mut LineReader<R>,
    writer: TableWriter,
    source_file: &str,
    workers: usize,
    batch_rows: usize,
    raw_keep: usize,
    mut on_line: impl FnMut(u64, &Line<'_>) -> Option<Rejected>,
) -> Result<(Merged, Vec<Rejected>, u64)> {
    let workers = workers.max(1);
    let merger = Merger {
        writer,
        batch_rows,
        seen: SeenIds::default(),
        repos: Default::default(),
        by_type: Default::default(),
        held: Default::default(),
        held_rows: 0,
        held_bytes: 0,
        written: 0,
        rejected: Vec::new(),
        raw_keep,
    };
    if workers == 1 {
        return parse_inline(lines, merger, source_file, raw_keep, &mut on_line);
    }
    let (run_tx, run_rx) = sync_channel::<Run>(1);
    let run_rx = Arc::new(Mutex::new(run_rx));
    let (parsed_tx, parsed_rx) = sync_channel::<ParsedRun>(1);
    let source: Arc<str> = Arc::from(source_file);

    let mut handles = Vec::new();
    for w in 0..workers {
        let rx = run_rx.clone();
        let tx = parsed_tx.clone();
        let source = source.clone();
        handles.push(std::thread::Builder::new().name(format!("ingest-parse-{w}")).spawn(move || {
            // One builder for every run: its buffers, sized by the runs before, are reused.
            let mut builder = ClusteredEvents::new(RUN_LINES.min(batch_rows));
            loop {
                // The lock is held only to take the next run.
                let next = rx.lock().map(|r| r.recv());
                let Ok(Ok(run)) = next else { return };
                if tx.send(parse_run(run, &mut builder, &source, raw_keep)).is_err() {
                    return;
                }
            }
        })?);
    }
    drop(parsed_tx);
    let merge = std::thread::Builder::new().name("ingest-merge".into()).spawn(move || merge(merger, parsed_rx))?;

    let mut reader_rejected = Vec::new();
    let sent = split_runs(lines, &mut on_line, &mut reader_rejected, |run| {
        run_tx.send(run).map_err(|_| anyhow::anyhow!("the ingest parsing threads stopped"))
    });
    drop(run_tx);
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("an ingest parsing thread panicked"))?;
    }
    // The merge's own error (a write that failed) says more than the send that it stopped.
    let merged = merge.join().map_err(|_| anyhow::anyhow!("the ingest merge thread panicked"))??;
    let line_no = sent?;
    Ok((merged, reader_rejected, line_no))
}

/// [`parse_lines`] on this thread alone: each line parsed as it is read, with no copy, its id
/// checked at once (in file order, as the merge checks it), and the events written in
/// batches that end where the merge ends them ([`Merger::hold`]) — so the files are those
/// that workers would write, without runs in between.
fn parse_inline<R: std::io::BufRead>(
    lines: &mut LineReader<R>,
    mut merger: Merger,
    source_file: &str,
    raw_keep: usize,
    on_line: &mut impl FnMut(u64, &Line<'_>) -> Option<Rejected>,
) -> Result<(Merged, Vec<Rejected>, u64)> {
    let mut builder = ClusteredEvents::new(merger.batch_rows);
    let mut rejected = Vec::new();
    let mut reader_rejected = Vec::new();
    let (mut line_no, mut held, mut held_bytes) = (0u64, 0usize, 0usize);
    while let Some(line) = lines.next_line() {
        line_no += 1;
        if let Line::Complete(bytes) = &line {
            let m = &mut merger;
            let mut duplicate = None;
            let mut kept = 0;
            parse_one(bytes, line_no, &mut builder, source_file, raw_keep, &mut rejected, |ev| {
                if m.seen.insert(&ev.id) {
                    m.kept(&ev.kind, ev.repo_name.as_deref());
                    kept = ev.payload_raw.len() + 256;
                    true
                } else {
                    duplicate = Some(Rejection::new(
                        "duplicate_id",
                        format!("event id {} already appeared earlier in this file", ev.id),
                    ));
                    false
                }
            });
            if let Some(r) = duplicate {
                merger.rejected.push(Rejected {
                    line: line_no,
                    rejection: r,
                    raw: lossy_prefix(bytes, raw_keep),
                    total: bytes.len(),
                });
            }
            if kept > 0 {
                (held, held_bytes) = (held + 1, held_bytes + kept);
                if held >= merger.batch_rows || held_bytes >= HELD_BYTES {
                    for (_, batch) in builder.finish_groups() {
                        merger.writer.write(&batch)?;
                    }
                    (held, held_bytes) = (0, 0);
                }
            }
        }
        reader_rejected.extend(on_line(line_no, &line));
    }
    for (_, batch) in builder.finish_groups() {
        merger.writer.write(&batch)?;
    }
    let mut merged = finish_merge(merger)?;
    merged.rejected.extend(rejected);
    Ok((merged, reader_rejected, line_no))
}

/// Reads every line, gathering complete ones into runs handed to `emit`; returns the number
/// of lines.
fn split_runs<R: std::io::BufRead>(
    lines: &mut LineReader<R>,
    on_line: &mut impl FnMut(u64, &Line<'_>) -> Option<Rejected>,
    reader_rejected: &mut Vec<Rejected>,
    mut emit: impl FnMut(Run) -> Result<()>,
) -> Result<u64> {
    let mut line_no: u64 = 0;
    let mut seq = 0u64;
    let new_run =
        |seq| Run { seq, buf: Vec::with_capacity(RUN_BYTES + (64 << 10)), lines: Vec::with_capacity(RUN_LINES) };
    let mut run = new_run(seq);
    while let Some(line) = lines.next_line() {
        line_no += 1;
        if let Line::Complete(bytes) = &line {
            let start = run.buf.len();
            run.buf.extend_from_slice(bytes);
            run.lines.push((line_no, start, run.buf.len()));
        }
        reader_rejected.extend(on_line(line_no, &line));
        if run.lines.len() >= RUN_LINES || run.buf.len() >= RUN_BYTES {
            seq += 1;
            emit(std::mem::replace(&mut run, new_run(seq)))?;
        }
    }
    if !run.lines.is_empty() {
        emit(run)?;
    }
    Ok(line_no)
}

fn merge(mut m: Merger, rx: Receiver<ParsedRun>) -> Result<Merged> {
    let mut waiting: std::collections::BTreeMap<u64, ParsedRun> = Default::default();
    let mut next = 0u64;
    let mut worker_rejected = Vec::new();
    for p in rx {
        waiting.insert(p.seq, p);
        while let Some(p) = waiting.remove(&next) {
            next += 1;
            let ParsedRun { seq, batches, rejected, run } = p;
            worker_rejected.extend(rejected);
            m.take(ParsedRun { seq, batches, rejected: Vec::new(), run })?;
        }
    }
    if !waiting.is_empty() {
        anyhow::bail!("an ingest parsing thread stopped before its part of the file was parsed");
    }
    let mut merged = finish_merge(m)?;
    merged.rejected.extend(worker_rejected);
    Ok(merged)
}

fn finish_merge(mut m: Merger) -> Result<Merged> {
    m.flush()?;
    let events = m.writer.finish()?;
    Ok(Merged {
        events,
        events_written: m.written,
        by_type: m.by_type,
        distinct_repos: m.repos.len() as u64,
        rejected: m.rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read};

    /// `line` with the id of the `n`th line: each line of the generated hour its own event.
    fn with_id(line: &[u8], n: usize) -> Vec<u8> {
        let text = std::str::from_utf8(line).unwrap();
        let start = text.find("\"id\":\"").unwrap() + 6;
        let end = start + text[start..].find('"').unwrap();
        format!("{}{}{}", &text[..start], 7_000_000_000u64 + n as u64, &text[end..]).into_bytes()
    }

    /// Real archive lines with what goes wrong in real files mixed in: ids repeated within a
    /// run and across runs, blank lines, broken JSON, invalid UTF-8, a line over the limit.
    fn hour() -> Vec<u8> {
        let f = std::fs::File::open("tests/data/gharchive/2015-01-01-15.json.gz").unwrap();
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(f).read_to_end(&mut text).unwrap();
        let real: Vec<&[u8]> = text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        let mut out = Vec::new();
        for i in 0..(3 * RUN_LINES + 777) {
            match i % 997 {
                5 => out.extend_from_slice(b"   "),
                6 => out.extend_from_slice(b"{\"id\":\"1\",\"type\":"),
                7 => out.extend_from_slice(b"{\"id\":\"\xff\xfe\"}"),
                8 => out.extend_from_slice(&vec![b'x'; 150_000]),
                // An event of a line a run or a few lines earlier again (its id too).
                9 => out.extend_from_slice(&with_id(real[(i / 2) % real.len()], i / 2)),
                10 => out.extend_from_slice(&with_id(real[(i - 7) % real.len()], i - 7)),
                _ => out.extend_from_slice(&with_id(real[i % real.len()], i)),
            }
            out.push(b'\n');
        }
        out
    }

    /// (line, reason, raw, length) of a rejected line.
    type Row = (u64, String, String, usize);

    /// The events written, the rejections, lines read, events written, distinct repositories.
    fn run(input: &[u8], workers: usize) -> (Vec<RecordBatch>, Vec<Row>, u64, u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let schema = crate::ingest::batch::EVENTS_SCHEMA.clone();
        let writer = TableWriter::in_dir(
            dir.path().to_path_buf(),
            false,
            "k",
            &schema,
            Some(crate::ingest::batch::EVENT_DATE),
            crate::lake::writer_properties(&[], &[], crate::lake::Codec::Zstd),
        )
        .unwrap();
        let mut lines = LineReader::new(input, 100_000);
        let on_line = |n: u64, l: &Line<'_>| match l {
            Line::TooLong { prefix, total } => Some(Rejected {
                line: n,
                rejection: Rejection::new("line_too_long", "long"),
                raw: lossy_prefix(prefix, 64),
                total: *total,
            }),
            _ => None,
        };
        let (merged, reader, lines_read) =
            parse_lines(&mut lines, writer, "h.json.gz", workers, 5000, 64, on_line).unwrap();
        let mut batches = Vec::new();
        for f in &merged.events {
            let file = std::fs::File::open(dir.path().join(&f.rel_path)).unwrap();
            let r =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
            batches.extend(r.map(Result::unwrap));
        }
        let mut rejected: Vec<_> = merged
            .rejected
            .iter()
            .chain(&reader)
            .map(|r| (r.line, r.rejection.code.clone(), r.raw.clone(), r.total))
            .collect();
        rejected.sort();
        (batches, rejected, lines_read, merged.events_written, merged.distinct_repos)
    }

    /// One thread or several, the files hold the same rows in the same order (batches of 5000
    /// events, ending inside the workers' runs of 4096 lines) and the same lines are rejected
    /// for the same reasons; every line is accounted for.
    #[test]
    fn workers_change_nothing_but_speed() {
        let input = hour();
        let one = run(&input, 1);
        let lines = input.lines().count() as u64;
        assert_eq!(one.2, lines);
        assert_eq!(one.3 + one.1.len() as u64, lines, "every line is an event or a rejection");
        assert_eq!(one.0.iter().map(RecordBatch::num_rows).sum::<usize>() as u64, one.3);
        let mut codes = std::collections::BTreeMap::new();
        for r in &one.1 {
            *codes.entry(r.1.clone()).or_insert(0) += 1;
        }
        assert!(one.3 > 12_000 && codes["duplicate_id"] >= 20, "{} events, rejections {codes:?}", one.3);
        for code in ["empty_line", "invalid_json", "invalid_utf8", "line_too_long", "duplicate_id"] {
            assert!(one.1.iter().any(|r| r.1 == code), "no {code} rejection");
        }
        for workers in [2, 3] {
            let many = run(&input, workers);
            assert_eq!(one.0, many.0, "{workers} workers wrote other rows");
            assert_eq!(one.1, many.1);
            assert_eq!((one.2, one.3, one.4), (many.2, many.3, many.4));
        }
    }
}
