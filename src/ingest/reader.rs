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
        Compression::Gzip => {
            Box::new(ReadAhead::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, file)))?)
        }
        Compression::Plain => Box::new(BufReader::with_capacity(BUF, file)),
    })
}

/// A [`BufRead`] whose bytes another thread decodes ahead of the reader: while one chunk is
/// split and parsed here, the next ones are being decompressed, so on two cores gunzip and
/// parsing overlap (one hour file is one gzip stream and cannot itself be split). At most
/// `AHEAD` chunks of `CHUNK` bytes wait at a time; a read error reaches the reader after the
/// good bytes before it, as from the decoder itself.
pub struct ReadAhead {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    /// Emptied chunks go back to the decoding thread to be filled again.
    recycle: std::sync::mpsc::SyncSender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    /// The decoder's error, returned by every call from then on (as a failed decoder does).
    failed: Option<(io::ErrorKind, String)>,
    ended: bool,
}

const CHUNK: usize = 1 << 20;
const AHEAD: usize = 3;

impl ReadAhead {
    pub fn new<R: Read + Send + 'static>(mut inner: R) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<u8>>>(AHEAD);
        let (recycle, spare) = std::sync::mpsc::sync_channel::<Vec<u8>>(AHEAD + 2);
        std::thread::Builder::new().name("ingest-decode".into()).spawn(move || loop {
            let mut buf = spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK));
            buf.resize(CHUNK, 0);
            let mut n = 0;
            let mut error = None;
            while n < CHUNK {
                match inner.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(got) => n += got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            buf.truncate(n);
            let last = n < CHUNK || error.is_some();
            // A closed channel means the reader stopped early: nothing more to do.
            if n > 0 && tx.send(Ok(buf)).is_err() {
                return;
            }
            if let Some(e) = error {
                let _ = tx.send(Err(e));
                return;
            }
            if last {
                return;
            }
        })?;
        Ok(ReadAhead { rx, recycle, cur: Vec::new(), pos: 0, failed: None, ended: false })
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ReadAhead {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.cur.len() && !self.ended {
            if let Some((kind, message)) = &self.failed {
                return Err(io::Error::new(*kind, message.clone()));
            }
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    let old = std::mem::replace(&mut self.cur, chunk);
                    self.pos = 0;
                    let _ = self.recycle.try_send(old);
                }
                Ok(Err(e)) => self.failed = Some((e.kind(), e.to_string())),
                Err(_) => self.ended = true,
            }
        }
        Ok(&self.cur[self.pos.min(self.cur.len())..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.cur.len());
    }
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

    /// Chunks decoded ahead give the same lines as the decoder read directly, across chunk
    /// boundaries, and a truncated stream still ends in the decoder's error after its good
    /// lines.
    #[test]
    fn read_ahead_is_the_stream_itself() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for i in 0..90_000 {
            writeln!(enc, "{{\"line\":{i},\"pad\":\"{}\"}}", "y".repeat(i % 97)).unwrap();
        }
        let gz = enc.finish().unwrap();
        let collect = |r: Box<dyn BufRead>| {
            let mut lr = LineReader::new(r, 1 << 20);
            let mut out = Vec::new();
            while let Some(l) = lr.next_line() {
                out.push(match l {
                    Line::Complete(b) => String::from_utf8_lossy(b).into_owned(),
                    Line::TooLong { .. } => "long".into(),
                    Line::StreamError { error, .. } => format!("err:{:?}", error.kind()),
                });
            }
            (out, lr.bytes_read())
        };
        for input in [&gz[..], &gz[..gz.len() * 2 / 3]] {
            let direct = collect(Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(input))));
            let ahead = collect(Box::new(
                ReadAhead::new(flate2::read::MultiGzDecoder::new(io::Cursor::new(input.to_vec()))).unwrap(),
            ));
            assert!(direct.1 > 2 * CHUNK as u64);
            assert_eq!(direct, ahead);
        }
    }
}
