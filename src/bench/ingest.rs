//! `bench ingest`: one core, `swelake ingest` against the decompression floor, a zstd lower
//! bound and DuckDB's `read_json` → Parquet, on hours replicated from real GH Archive events.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{dir_bytes, have, timed_child, timed_child_on};
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
    /// Core counts to measure on (each: both sides pinned to that many CPUs).
    pub cores: Vec<usize>,
    /// Runs of each side per core count; medians are compared.
    pub repeat: usize,
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
            cores: vec![1, 2],
            repeat: 3,
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

/// The medians of `repeat` runs of `swelake ingest` and of DuckDB on one hour file.
pub(super) struct Versus {
    pub ingest_s: f64,
    pub ingest_runs: Vec<f64>,
    /// The highest peak RSS of the ingest runs, MiB.
    pub ingest_rss: f64,
    pub ingest_bytes: u64,
    pub duck_s: Option<f64>,
    pub duck_runs: Vec<f64>,
    pub duck_bytes: u64,
}

fn have_duckdb() -> bool {
    Command::new("python3").args(["-c", "import duckdb"]).status().map(|s| s.success()).unwrap_or(false)
}

/// Times `swelake ingest` (one file, `--jobs 1`) and DuckDB (when importable, `cpus` threads)
/// `repeat` times each, both on the first `cpus` CPUs, alternating so that a slow spell of
/// the machine falls on both sides; prints their rows (medians).
pub(super) fn ingest_vs_duckdb(
    work: &Path,
    hour: &Path,
    n: usize,
    bytes: usize,
    cpus: Option<usize>,
    repeat: usize,
) -> Result<Versus> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let hour_s = hour.to_string_lossy().into_owned();
    let lake = work.join("lake");
    let duck = have_duckdb();
    let script = work.join("duckdb_bench.py");
    std::fs::write(&script, DUCKDB_SCRIPT)?;
    let out_pq = work.join("duckdb.parquet");
    let threads = cpus.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut v = Versus {
        ingest_s: 0.0,
        ingest_runs: Vec::new(),
        ingest_rss: 0.0,
        ingest_bytes: 0,
        duck_s: None,
        duck_runs: Vec::new(),
        duck_bytes: 0,
    };
    for _ in 0..repeat.max(1) {
        let _ = std::fs::remove_dir_all(&lake);
        let (secs, rss, out) = timed_child_on(
            vec![
                exe.clone(),
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
            cpus,
        )?;
        let summary: serde_json::Value = serde_json::from_str(&out).context("reading the ingest summary")?;
        if summary["events_written"].as_u64() != Some(n as u64) {
            bail!("ingest wrote {} events, expected {n}", summary["events_written"]);
        }
        v.ingest_runs.push(secs);
        v.ingest_rss = v.ingest_rss.max(rss);
        v.ingest_bytes = dir_bytes(&lake.join("events"));
        if duck {
            let _ = std::fs::remove_file(&out_pq);
            let (wall, _, out) = timed_child_on(
                vec![
                    "python3".into(),
                    script.to_string_lossy().into_owned(),
                    hour_s.clone(),
                    out_pq.to_string_lossy().into_owned(),
                    threads.to_string(),
                ],
                cpus,
            )?;
            v.duck_runs.push(out.trim().parse().unwrap_or(wall));
            v.duck_bytes = dir_bytes(&out_pq);
        }
    }
    let row = |name: &str, s: f64, runs: &[f64], out_bytes: u64| {
        println!(
            "{name:<34} {s:>9.2} {:>12.0} {:>10.0} {:>10.1}   runs {}",
            n as f64 / s,
            bytes as f64 / 1e6 / s,
            out_bytes as f64 / 1e6,
            super::jobs::runs_list(runs)
        )
    };
    v.ingest_s = super::jobs::median(&v.ingest_runs);
    row("swelake ingest (zstd)", v.ingest_s, &v.ingest_runs, v.ingest_bytes);
    if duck {
        let d = super::jobs::median(&v.duck_runs);
        row("duckdb read_json -> parquet", d, &v.duck_runs, v.duck_bytes);
        v.duck_s = Some(d);
    } else {
        println!("{:<34} (python3 cannot import duckdb: pip install duckdb)", "duckdb read_json -> parquet");
    }
    Ok(v)
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
        println!("(taskset not found: timings are not pinned to one core, and --cores cannot be honoured)");
    }
    let header =
        |what: &str| println!("{what:<34} {:>9} {:>12} {:>10} {:>10}", "seconds", "events/s", "MB/s JSON", "output MB");
    let cores: Vec<usize> = if a.cores.is_empty() { vec![1] } else { a.cores.clone() };

    let hour = a.work.join("2025-01-01-15.json.gz");
    println!("generating {} (>= {} events, >= {} MB of JSON) ...", hour.display(), a.events, a.mb);
    let (n, bytes) = make_hour(&a.seed, a.events, a.mb << 20, false, &hour)?;
    let gz_mb = std::fs::metadata(&hour)?.len() as f64 / 1e6;
    println!("  {n} events, {:.0} MB JSON, {gz_mb:.0} MB gzipped\n", bytes as f64 / 1e6);
    header("one core");
    let (floor_s, _) = floor_and_bound(&hour, n, bytes, pin)?;
    let mut copied = Vec::new();
    for &c in &cores {
        println!("{c} core(s), medians of {}:", a.repeat);
        copied.push(ingest_vs_duckdb(&a.work, &hour, n, bytes, pin.then_some(c), a.repeat)?);
    }

    let distinct = a.work.join("distinct").join("2025-01-01-15.json.gz");
    std::fs::create_dir_all(distinct.parent().expect("has a parent"))?;
    let (dn, dbytes) = make_hour(&a.seed, a.events, a.mb << 20, true, &distinct)?;
    println!("\nthe same hour with every payload distinct (\"_replica\":N), as in a real archive:");
    header("one core");
    let (d_floor_s, d_bound_s) = floor_and_bound(&distinct, dn, dbytes, pin)?;
    let mut spread = Vec::new();
    for &c in &cores {
        println!("{c} core(s), medians of {}:", a.repeat);
        spread.push(ingest_vs_duckdb(&a.work.join("distinct"), &distinct, dn, dbytes, pin.then_some(c), a.repeat)?);
    }

    println!();
    for ((c, cp), d) in cores.iter().zip(&copied).zip(&spread) {
        println!(
            "{c} core(s): swelake ingest / floor time: {:.2}x copied payloads, {:.2}x distinct payloads; distinct: swelake ingest / bound {:.2}x",
            cp.ingest_s / floor_s,
            d.ingest_s / d_floor_s,
            d.ingest_s / d_bound_s
        );
        match (cp.duck_s, d.duck_s) {
            (Some(dc), Some(dd)) => println!(
                "{c} core(s): swelake vs duckdb throughput: {:.2}x copied payloads, {:.2}x distinct payloads (target >= 1.5x); output {:.1} / {:.1} MB against {:.1} / {:.1} MB",
                dc / cp.ingest_s,
                dd / d.ingest_s,
                cp.ingest_bytes as f64 / 1e6,
                d.ingest_bytes as f64 / 1e6,
                cp.duck_bytes as f64 / 1e6,
                d.duck_bytes as f64 / 1e6
            ),
            _ => println!("{c} core(s): swelake vs duckdb throughput: not measured (no duckdb)"),
        }
        println!(
            "{c} core(s): swelake ingest peak RSS: {:.0} / {:.0} MiB (target < 1024 MiB)",
            cp.ingest_rss, d.ingest_rss
        );
    }
    println!(
        "  (the bound alone, no parsing and no columns, is {:.2}x the floor on the distinct hour)",
        d_bound_s / d_floor_s
    );
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
