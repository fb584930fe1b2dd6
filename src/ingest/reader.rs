//! Reading an hour file as lines with bounded memory.
//!
//! A line longer than the limit is consumed to its end but only its first bytes are kept,
//! so a 10 MB line costs no more memory than the limit. A decompression error (truncated or
//! corrupt gzip) ends the file and is reported with the partial line it interrupted, so the
//! caller can record it as a rejection instead of losing the tail silently.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// What `next` yields.
#[derive(Debug)]
pub enum Line<'a> {
    /// A complete line without its `\n`.
    Complete(&'a [u8]),
    /// A line over the limit: the kept prefix and the full length in bytes.
    TooLong { prefix: &'a [u8], total: usize },
    /// The stream failed inside (or right after) this line; no more lines follow.
    StreamError { partial: &'a [u8], total: usize, error: io::Error },
}

pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max_line: usize,
    done: bool,
    bytes_out: u64,
    /// Bytes of the last line returned straight from `inner`'s buffer, consumed on the
    /// next call (the caller was still borrowing them).
    pending: usize,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(inner: R, max_line: usize) -> Self {
        LineReader { inner, buf: Vec::with_capacity(64 * 1024), max_line, done: false, bytes_out: 0, pending: 0 }
    }

    /// Decompressed bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_out
    }

    /// The next line, or `None` at a clean end of input.
    pub fn next_line(&mut self) -> Option<Line<'_>> {
        if self.done {
            return None;
        }
        if self.pending > 0 {
            self.inner.consume(self.pending);
            self.pending = 0;
        }
        // Fast path: the whole line is already in the read buffer; hand it out uncopied.
        // (Probe first and borrow again to return: the borrow checker cannot yet see that
        // a conditionally returned borrow ends on the other branch.)
        let max_line = self.max_line;
        let whole = match self.inner.fill_buf() {
            Ok(available) => memchr::memchr(b'\n', available).filter(|&i| i <= max_line),
            Err(_) => None,
        };
        if let Some(i) = whole {
            self.pending = i + 1;
            self.bytes_out += (i + 1) as u64;
            // A non-empty buffer is handed out again without reading, so this is the same
            // slice as probed above.
            let available = self.inner.fill_buf().unwrap_or_default();
            return Some(Line::Complete(available.get(..i).unwrap_or_default()));
        }
        self.buf.clear();
        let mut total = 0usize;
        loop {
            let available = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    self.done = true;
                    return Some(Line::StreamError { partial: &self.buf, total, error });
                }
            };
            if available.is_empty() {
                self.done = true;
                if total == 0 {
                    return None;
                }
                break;
            }
            let (chunk_len, found) = match memchr::memchr(b'\n', available) {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            let room = (self.max_line + 1).saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&available[..chunk_len.min(room)]);
            total += chunk_len;
            let consumed = chunk_len + usize::from(found);
            self.inner.consume(consumed);
            self.bytes_out += consumed as u64;
            if found {
                break;
            }
        }
        if total > self.max_line {
            self.buf.truncate(self.max_line);
            return Some(Line::TooLong { prefix: &self.buf, total });
        }
        Some(Line::Complete(&self.buf))
    }
}

/// How the bytes of a source file are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Plain,
}

impl Compression {
    /// By name: `.gz` is gzip, anything else plain JSON lines.
    pub fn from_name(name: &str) -> Self {
        if name.ends_with(".gz") {
            Compression::Gzip
        } else {
            Compression::Plain
        }
    }
}

/// Counts compressed bytes read, for progress bars.
pub struct CountingRead<R> {
    inner: R,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens a local file as a buffered stream of decompressed bytes. `count` receives the
/// number of raw (compressed) bytes read so far.
pub fn open_decoded(
    path: &Path,
    compression: Compression,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> io::Result<Box<dyn BufRead + Send>> {
    let file = CountingRead { inner: File::open(path)?, count };
    const BUF: usize = 256 * 1024;
    Ok(match compression {
        // MultiGzDecoder: a concatenation of gzip members is one valid gzip stream.
        Compression::Gzip => Box::new(BufReader::with_capacity(
            BUF,
            flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, file)),
        )),
        Compression::Plain => Box::new(BufReader::with_capacity(BUF, file)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line() {
            out.push(match l {
                Line::Complete(b) => format!("ok:{}", String::from_utf8_lossy(b)),
                Line::TooLong { prefix, total } => format!("long:{}:{total}", String::from_utf8_lossy(prefix)),
                Line::StreamError { .. } => "err".into(),
            });
        }
        out
    }

    #[test]
    fn splits_and_limits() {
        assert_eq!(lines(b"a\nbb\n", 10), vec!["ok:a", "ok:bb"]);
        assert_eq!(lines(b"a\nbb", 10), vec!["ok:a", "ok:bb"], "last line without newline");
        assert_eq!(lines(b"a\n\nb\n", 10), vec!["ok:a", "ok:", "ok:b"], "blank lines are lines");
        assert_eq!(lines(b"abcdef\nx\n", 3), vec!["long:abc:6", "ok:x"]);
        assert_eq!(lines(b"abc\n", 3), vec!["ok:abc"], "exactly at the limit is fine");
        assert_eq!(lines(b"", 3), Vec::<String>::new());
    }

    #[test]
    fn truncated_gzip_is_reported() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        for i in 0..2000 {
            writeln!(enc, "{{\"line\":{i},\"pad\":\"{}\"}}", "x".repeat(i % 50)).unwrap();
        }
        let gz = enc.finish().unwrap();
        let cut = &gz[..gz.len() / 2];
        let dec = BufReader::new(flate2::read::MultiGzDecoder::new(cut));
        let mut r = LineReader::new(dec, 1 << 20);
        let (mut ok, mut errors) = (0, 0);
        while let Some(l) = r.next_line() {
            match l {
                Line::Complete(_) => ok += 1,
                Line::StreamError { error, .. } => {
                    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
                    errors += 1
                }
                Line::TooLong { .. } => unreachable!(),
            }
        }
        assert_eq!(errors, 1);
        assert!(ok > 100 && ok < 2000, "{ok}");
    }
}
