//! Local files: input files read line by line, plain or gzip-compressed (by the `.gz` extension):
//! reward cases, the demo's samples, benchmark inputs; and names made safe as one path segment.

use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};

/// A name as one path segment: anything but letters, digits, `-`, `_`, `.` becomes `_`
/// (`owner/name` → `owner_name`).
pub fn path_segment(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

/// Opens a file for reading lines, decompressing `.gz`.
pub fn open_maybe_gz(p: &Path) -> Result<Box<dyn BufRead>> {
    let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    // Case lines are KBs long: a large buffer means one read call per many lines, not
    // several per line.
    const BUF: usize = 1 << 20;
    Ok(if p.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::with_capacity(BUF, flate2::read::MultiGzDecoder::new(BufReader::new(f))))
    } else {
        Box::new(BufReader::with_capacity(BUF, f))
    })
}
