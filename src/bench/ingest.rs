//! `bench ingest`: one core, `swelake ingest` against the decompression floor, a zstd lower
//! bound and DuckDB's `read_json` → Parquet, on hours replicated from real GH Archive events.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{dir_bytes, have, timed_child};
use anyhow::{bail, Context, Result};

#[derive(Debug, Clone)]
pub struct IngestBenchOptions {
    /// Real GH Archive hour files whose events are replicated.
    pub seed: Vec<PathBuf>,
    /// Minimum number of events in the generated hour.
    pub events: usize,
    /// Minimum size of the generated hour as JSON, in MB.
    pub mb: usize,
    /// Working directory (generated hour, lakes, Parquet output).
    pub work: PathBuf,
}

impl Default for IngestBenchOptions {
    fn default() -> Self {
        IngestBenchOptions {
            seed: vec![
                PathBuf::from("tests/data/gharchive/2015-01-01-15.json.gz"),
                PathBuf::from("tests/data/gharchive/2025-01-01-15.json.gz"),
            ],
            events: 150_000,
            mb: 350,
            work: PathBuf::from("target/bench-ingest"),
        }
    }
}

/// Writes the replicated hour; returns (events, json bytes). Each seed line is kept byte for
/// byte (member order, escapes, whitespace: what real archives look like) except the values
/// of its top-level `id` and `created_at`. With `distinct`, each copy's payload also gets a
/// leading `"_replica":N` member, so no two payloads are equal, as in a real hour (plain
/// copies let a writer that dictionary-encodes the payload store ~3000 distinct values).
pub(super) fn make_hour(
    seeds: &[PathBuf],
    min_events: usize,
    min_bytes: usize,
    distinct: bool,
    out: &Path,
) -> Result<(usize, usize)> {
    let mut lines: Vec<String> = Vec::new();
    for s in seeds {
        let f = std::fs::File::open(s).with_context(|| format!("opening seed {}", s.display()))?;
        for line in std::io::BufReader::new(flate2::read::MultiGzDecoder::new(f)).lines() {
            let line = line?;
            if !line.trim().is_empty() {
                lines.push(line);
            }
        }
    }
    if lines.is_empty() {
        bail!("no seed events");
    }
    let file = std::fs::File::create(out)?;
    let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::new(6));
    let (mut n, mut bytes) = (0usize, 0usize);
    let mut line = String::new();
    while n < min_events || bytes < min_bytes {
        let seed = &lines[n % lines.len()];
        let members = crate::ingest::scan::members(seed)
            .map_err(|e| anyhow::anyhow!("seed line is not a JSON object: {}", e.message))?;
        line.clear();
        line.push('{');
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push_str(&serde_json::to_string(key.as_ref())?);
            line.push(':');
            match key.as_ref() {
                "id" => line.push_str(&format!("\"{}\"", 90_000_000_000u64 + n as u64)),
                "created_at" => line.push_str(&format!("\"2025-01-01T15:{:02}:{:02}Z\"", (n / 60) % 60, n % 60)),
                "payload" if distinct && value.starts_with('{') => {
                    let rest = &value[1..];
                    let sep = if rest.trim_start().starts_with('}') { "" } else { "," };
                    line.push_str(&format!("{{\"_replica\":{n}{sep}{rest}"));
                }
                _ => line.push_str(value),
            }
        }
        line.push('}');
        gz.write_all(line.as_bytes())?;
        gz.write_all(b"\n")?;
        bytes += line.len() + 1;
        n += 1;
    }
    gz.finish()?.flush()?;
    Ok((n, bytes))
}

/// Size of the chunks the bound compresses: the Parquet writer's default data page size.
pub(super) const BOUND_PAGE: usize = 1 << 20;

/// Decompresses `path` and counts its lines; with `zstd_pages`, also compresses the JSON
/// text with zstd level 1 in independent 1 MiB pages, as a Parquet column writer does with
/// its data pages, and returns the compressed bytes too. That is about the least work an
/// ingest writing zstd-1 files does for this text when its payloads are distinct, parsing and
/// encoding aside (the bound; hidden helper run as a child of `bench ingest`).
pub fn gunzip_pages(path: &Path, zstd_pages: bool) -> Result<(u64, u64)> {
    let f = std::fs::File::open(path)?;
    let mut r = flate2::read::MultiGzDecoder::new(std::io::BufReader::with_capacity(256 << 10, f));
    let mut buf = vec![0u8; if zstd_pages { BOUND_PAGE } else { 256 << 10 }];
    let mut zstd = if zstd_pages { Some(zstd::bulk::Compressor::new(1)?) } else { None };
    let mut packed = Vec::with_capacity(zstd::zstd_safe::compress_bound(BOUND_PAGE));
    let (mut lines, mut out_bytes) = (0u64, 0u64);
    loop {
        // Fill a whole page before compressing it (a read returns at most one inflate window).
        let mut n = 0;
        while n < buf.len() {
            let got = r.read(&mut buf[n..])?;
            if got == 0 {
                break;
            }
            n += got;
        }
        if n == 0 {
            break;
        }
        lines += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
        if let Some(z) = zstd.as_mut() {
            packed.clear();
            z.compress_to_buffer(&buf[..n], &mut packed)?;
            out_bytes += packed.len() as u64;
        }
    }
    Ok((lines, out_bytes))
}

pub(super) const DUCKDB_SCRIPT: &str = include_str!("../../bench/duckdb_ingest.py");

/// Times `swelake ingest` and DuckDB (when importable) on one hour file; prints their rows.
/// Returns (swelake seconds, swelake peak RSS MiB, DuckDB seconds).
pub(super) fn ingest_vs_duckdb(
    work: &Path,
    hour: &Path,
    n: usize,
    bytes: usize,
    pin: bool,
) -> Result<(f64, f64, Option<f64>)> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let hour_s = hour.to_string_lossy().into_owned();
    let lake = work.join("lake");
    let _ = std::fs::remove_dir_all(&lake);
    let (ingest_s, ingest_rss, out) = timed_child(
        vec![
            exe,
            "--quiet".into(),
            "ingest".into(),
            "--source".into(),
            hour_s.clone(),
            "--lake".into(),
            lake.to_string_lossy().into_owned(),
            "--jobs".into(),
            "1".into(),
            "--json".into(),
        ],
        pin,
    )?;
    let summary: serde_json::Value = serde_json::from_str(&out).context("reading the ingest summary")?;
    if summary["events_written"].as_u64() != Some(n as u64) {
        bail!("ingest wrote {} events, expected {n}", summary["events_written"]);
    }
    let row = |name: &str, s: f64, out_bytes: u64| {
        println!(
            "{name:<34} {s:>9.2} {:>12.0} {:>10.0} {:>10.1}",
            n as f64 / s,
            bytes as f64 / 1e6 / s,
            out_bytes as f64 / 1e6
        )
    };
    row("swelake ingest (zstd)", ingest_s, dir_bytes(&lake.join("events")));
    let duck = Command::new("python3").args(["-c", "import duckdb"]).status().map(|s| s.success()).unwrap_or(false);
    if !duck {
        println!("{:<34} (python3 cannot import duckdb: pip install duckdb)", "duckdb read_json -> parquet");
        return Ok((ingest_s, ingest_rss, None));
    }
    let script = work.join("duckdb_bench.py");
    std::fs::write(&script, DUCKDB_SCRIPT)?;
    let out_pq = work.join("duckdb.parquet");
    let (wall, _, out) = timed_child(
        vec!["python3".into(), script.to_string_lossy().into_owned(), hour_s, out_pq.to_string_lossy().into_owned()],
        pin,
    )?;
    let inner: f64 = out.trim().parse().unwrap_or(wall);
    row("duckdb read_json -> parquet", inner, dir_bytes(&out_pq));
    Ok((ingest_s, ingest_rss, Some(inner)))
}

/// Times the floor and the zstd bound on `hour` (pinned children) and prints their rows.
/// Returns (floor seconds, bound seconds).
pub(super) fn floor_and_bound(hour: &Path, n: usize, bytes: usize, pin: bool) -> Result<(f64, f64)> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let helper = |zstd_pages: bool| -> Result<(f64, u64)> {
        let mut args = vec![exe.clone(), "bench-floor".into(), hour.to_string_lossy().into_owned()];
        if zstd_pages {
            args.push("--zstd-pages".into());
        }
        let (secs, _, out) = timed_child(args, pin)?;
        let mut fields = out.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        let (lines, packed) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
        if lines != n as u64 {
            bail!("bench-floor counted {lines} lines, expected {n}");
        }
        Ok((secs, packed))
    };
    let (floor_s, _) = helper(false)?;
    let (bound_s, bound_bytes) = helper(true)?;
    println!(
        "{:<34} {floor_s:>9.2} {:>12.0} {:>10.0}",
        "decompress + count lines (floor)",
        n as f64 / floor_s,
        bytes as f64 / 1e6 / floor_s
    );
    println!(
        "{:<34} {bound_s:>9.2} {:>12.0} {:>10.0} {:>10.1}",
        "floor + zstd-1 of the JSON (bound)",
        n as f64 / bound_s,
        bytes as f64 / 1e6 / bound_s,
        bound_bytes as f64 / 1e6
    );
    Ok((floor_s, bound_s))
}

pub async fn ingest(a: &IngestBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work)?;
    let pin = have("taskset", "-V");
    if !pin {
        println!("(taskset not found: timings are not pinned to one core)");
    }
    let header =
        || println!("{:<34} {:>9} {:>12} {:>10} {:>10}", "one core", "seconds", "events/s", "MB/s JSON", "output MB");

    let hour = a.work.join("2025-01-01-15.json.gz");
    println!("generating {} (>= {} events, >= {} MB of JSON) ...", hour.display(), a.events, a.mb);
    let (n, bytes) = make_hour(&a.seed, a.events, a.mb << 20, false, &hour)?;
    let gz_mb = std::fs::metadata(&hour)?.len() as f64 / 1e6;
    println!("  {n} events, {:.0} MB JSON, {gz_mb:.0} MB gzipped\n", bytes as f64 / 1e6);
    header();
    let (floor_s, _) = floor_and_bound(&hour, n, bytes, pin)?;
    let (ingest_s, ingest_rss, duck_s) = ingest_vs_duckdb(&a.work, &hour, n, bytes, pin)?;

    let distinct = a.work.join("distinct").join("2025-01-01-15.json.gz");
    std::fs::create_dir_all(distinct.parent().expect("has a parent"))?;
    let (dn, dbytes) = make_hour(&a.seed, a.events, a.mb << 20, true, &distinct)?;
    println!("\nthe same hour with every payload distinct (\"_replica\":N), as in a real archive:");
    header();
    let (d_floor_s, d_bound_s) = floor_and_bound(&distinct, dn, dbytes, pin)?;
    let (d_ingest_s, d_rss, d_duck_s) = ingest_vs_duckdb(&a.work.join("distinct"), &distinct, dn, dbytes, pin)?;

    println!(
        "\nswelake ingest / floor time: {:.2}x copied payloads, {:.2}x distinct payloads (target <= 1.5x)",
        ingest_s / floor_s,
        d_ingest_s / d_floor_s
    );
    // Copied payloads are dictionary-encoded, so only the distinct hour's writer has to
    // compress nearly all of its text: there the bound is about the least a zstd-writing
    // ingest can take.
    println!(
        "  distinct payloads: the bound alone (no parsing, no columns) / floor: {:.2}x; swelake ingest / bound: {:.2}x",
        d_bound_s / d_floor_s,
        d_ingest_s / d_bound_s
    );
    match (duck_s, d_duck_s) {
        (Some(d), Some(dd)) => println!(
            "swelake vs duckdb throughput: {:.2}x copied payloads, {:.2}x distinct payloads (target > 1x)",
            d / ingest_s,
            dd / d_ingest_s
        ),
        _ => println!("swelake vs duckdb throughput: not measured (no duckdb)"),
    }
    println!("swelake ingest peak RSS: {ingest_rss:.0} / {d_rss:.0} MiB (target < 1024 MiB)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_compresses_whole_pages_and_counts_every_line() -> Result<()> {
        // Two gzip members (as concatenated hour files are), ~2.6 MiB of lines in all, so the
        // reader's short reads must be gathered into full pages.
        let mut text = String::new();
        for i in 0..24_000 {
            text.push_str(&format!("{{\"id\":\"{i}\",\"payload\":{{\"n\":{}}}}}\n", i * 7919 % 10_007));
        }
        text.push_str(&"x".repeat(2_000_000));
        text.push('\n');
        let split = text.len() / 3;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("hour.json.gz");
        let mut file = std::fs::File::create(&path)?;
        for part in [&text[..split], &text[split..]] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(part.as_bytes())?;
            file.write_all(&gz.finish()?)?;
        }
        drop(file);

        let lines = text.matches('\n').count() as u64;
        assert_eq!(gunzip_pages(&path, false)?, (lines, 0));
        let expected: u64 = text
            .as_bytes()
            .chunks(BOUND_PAGE)
            .map(|page| zstd::bulk::compress(page, 1).map(|c| c.len() as u64))
            .sum::<std::io::Result<u64>>()?;
        assert_eq!(gunzip_pages(&path, true)?, (lines, expected));
        Ok(())
    }
}
