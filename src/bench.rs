//! Benchmarks: each prints a figure next to a baseline measured on the same machine in the
//! same run, and the ratio. They are commands, never timed tests.
//!
//! `bench ingest` builds a large hour by replicating real GH Archive events with fresh ids,
//! then times, each pinned to one core (`taskset -c 0` when available): plain decompression
//! with a line count (the floor), `swelake ingest`, and DuckDB's typed `read_json` → Parquet
//! when python3 can import duckdb. `bench reward` times `swelake reward` with one thread and
//! with all threads against python3's difflib running the same cases.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

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

#[derive(Debug, Clone)]
pub struct BlobsBenchOptions {
    /// A bare or normal git repository to read every blob of. Without it, one is made from
    /// the source files under --corpus.
    pub repo: Option<PathBuf>,
    /// Directory of real files committed into the benchmark repository (default: the
    /// datafusion sources in the cargo registry, else this project's src/).
    pub corpus: Option<PathBuf>,
    /// Working directory.
    pub work: PathBuf,
}

impl Default for BlobsBenchOptions {
    fn default() -> Self {
        BlobsBenchOptions { repo: None, corpus: None, work: PathBuf::from("target/bench-blobs") }
    }
}

#[derive(Debug, Clone)]
pub struct RewardBenchOptions {
    /// Reward cases (JSONL, optionally gzipped).
    pub cases: PathBuf,
    /// Copies of the cases scored by swelake per timing (Python runs them once).
    pub repeat: usize,
    /// Timings of each side; the best is reported (this machine is shared and noisy, and the
    /// best run is the one least disturbed, for Python and swelake alike).
    pub runs: usize,
    /// Working directory.
    pub work: PathBuf,
}

impl Default for RewardBenchOptions {
    fn default() -> Self {
        RewardBenchOptions {
            cases: PathBuf::from("tests/data/parity/reward_cases.jsonl.gz"),
            repeat: 20,
            runs: 3,
            work: PathBuf::from("target/bench-reward"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LakeBenchOptions {
    /// Real GH Archive hour files whose events are replicated.
    pub seed: Vec<PathBuf>,
    /// Hours generated and ingested.
    pub hours: usize,
    /// Events per generated hour.
    pub events: usize,
    /// An S3-compatible endpoint to use (default: start `moto_server` on loopback if it is
    /// installed, else leave the S3 rows out).
    pub s3_endpoint: Option<String>,
    /// Working directory.
    pub work: PathBuf,
}

impl Default for LakeBenchOptions {
    fn default() -> Self {
        LakeBenchOptions {
            seed: IngestBenchOptions::default().seed,
            hours: 4,
            events: 60_000,
            s3_endpoint: None,
            work: PathBuf::from("target/bench-lake"),
        }
    }
}

/// A moto server started by the benchmark, stopped when dropped.
struct LocalS3(std::process::Child);

impl Drop for LocalS3 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> Result<(LocalS3, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting moto_server")?;
    let guard = LocalS3(child);
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("moto_server did not start");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok((guard, format!("http://127.0.0.1:{port}")))
}

/// Creates a bucket on an S3-compatible endpoint that takes unsigned requests (moto, MinIO
/// in anonymous mode).
fn create_bucket(endpoint: &str, bucket: &str) -> Result<()> {
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {endpoint}"))?;
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    if !(response.starts_with("HTTP/1.1 200") || response.contains("BucketAlreadyOwnedByYou")) {
        bail!("creating bucket {bucket}: {}", response.lines().next().unwrap_or(""));
    }
    Ok(())
}

/// `bench lake`: ingest of generated hours into a local lake and into an S3-compatible store,
/// with one and with two hours at a time, side by side.
pub fn lake(a: &LakeBenchOptions) -> Result<()> {
    let src = a.work.join("hours");
    std::fs::create_dir_all(&src)?;
    let mut total = 0;
    for h in 0..a.hours {
        let (n, _) = make_hour(&a.seed, a.events, 0, true, &src.join(format!("2025-01-01-{h}.json.gz")))?;
        total += n;
    }
    let gz: u64 = (0..a.hours)
        .map(|h| std::fs::metadata(src.join(format!("2025-01-01-{h}.json.gz"))).map_or(0, |m| m.len()))
        .sum();
    println!("{} generated hours: {total} events, {:.0} MB gzipped\n", a.hours, gz as f64 / 1e6);
    let (_moto, endpoint) = match &a.s3_endpoint {
        Some(e) => (None, Some(e.clone())),
        None if have("moto_server", "--help") => {
            let (g, e) = start_moto()?;
            (Some(g), Some(e))
        }
        None => (None, None),
    };
    if let Some(e) = &endpoint {
        create_bucket(e, "swelake-bench")?;
        // The children reach the store through the standard variables.
        std::env::set_var("AWS_ENDPOINT_URL", e);
        std::env::set_var("AWS_ALLOW_HTTP", "true");
        std::env::set_var("AWS_REGION", std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()));
        if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
            std::env::set_var("AWS_ACCESS_KEY_ID", "bench");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "bench");
        }
    }
    let exe = std::env::current_exe()?.display().to_string();
    println!("{:<28} {:>9} {:>12} {:>9}", "ingest", "seconds", "events/s", "vs jobs 1");
    let run = |label: &str, lake: String, jobs: usize, base: Option<f64>| -> Result<f64> {
        let args = vec![
            exe.clone(),
            "-q".into(),
            "ingest".into(),
            "--source".into(),
            src.display().to_string(),
            "--lake".into(),
            lake,
            "--jobs".into(),
            jobs.to_string(),
        ];
        let (secs, _, _) = timed_child(args, false)?;
        let ratio = base.map_or("1.00x".to_string(), |b| format!("{:.2}x", b / secs));
        println!("{label:<28} {secs:>9.2} {:>12.0} {ratio:>9}", total as f64 / secs);
        Ok(secs)
    };
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let local = |j: usize| a.work.join(format!("lake-{stamp}-{j}")).display().to_string();
    let l1 = run("local disk, --jobs 1", local(1), 1, None)?;
    let l2 = run("local disk, --jobs 2", local(2), 2, Some(l1))?;
    let mut s3 = None;
    if endpoint.is_some() {
        let s1 = run("S3 (loopback), --jobs 1", format!("s3://swelake-bench/{stamp}-1"), 1, None)?;
        let s2 = run("S3 (loopback), --jobs 2", format!("s3://swelake-bench/{stamp}-2"), 2, Some(s1))?;
        s3 = Some((s1, s2));
    } else {
        println!("(no S3 endpoint: install moto[server] or pass --s3-endpoint for the S3 rows)");
    }
    println!("\nlocal --jobs 2 / --jobs 1: {:.2}x (target >= 1.8x on 2 cores)", l1 / l2);
    if let Some((s1, s2)) = s3 {
        println!("S3 --jobs 2 / --jobs 1: {:.2}x; S3 / local time at --jobs 1: {:.2}x", s1 / s2, s1 / l1);
    }
    for j in [1, 2] {
        let _ = std::fs::remove_dir_all(local(j));
    }
    Ok(())
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Runs a command pinned to CPU 0 if `taskset` exists; returns wall seconds, the peak RSS of
/// that child in MiB (from its own `wait4` usage, not the maximum over earlier children) and
/// its stdout.
fn timed_child(mut args: Vec<String>, pin: bool) -> Result<(f64, f64, String)> {
    if pin {
        args.splice(0..0, ["taskset".to_string(), "-c".to_string(), "0".to_string()]);
    }
    let t = Instant::now();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", args[0]))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut e = String::new();
        let _ = stderr.read_to_string(&mut e);
        e
    });
    let mut out = String::new();
    stdout.read_to_string(&mut out)?;
    let mut status = 0i32;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; wait4 only writes into the two out-parameters.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let secs = t.elapsed().as_secs_f64();
    let err = err_reader.join().unwrap_or_default();
    if pid < 0 {
        bail!("waiting for {}: {}", args[0], std::io::Error::last_os_error());
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let hint = if sig == libc::SIGKILL { " (SIGKILL: out of memory? see dmesg)" } else { "" };
        bail!(
            "{} was killed by signal {sig}{hint} at {:.0} MiB peak RSS: {err}",
            args.join(" "),
            usage.ru_maxrss as f64 / 1024.0
        );
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("{} failed: {err}", args.join(" "));
    }
    Ok((secs, usage.ru_maxrss as f64 / 1024.0, out))
}

/// Writes the replicated hour; returns (events, json bytes). Each seed line is kept byte for
/// byte (member order, escapes, whitespace: what real archives look like) except the values
/// of its top-level `id` and `created_at`. With `distinct`, each copy's payload also gets a
/// leading `"_replica":N` member, so no two payloads are equal, as in a real hour (plain
/// copies let a writer that dictionary-encodes the payload store ~3000 distinct values).
fn make_hour(
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
const BOUND_PAGE: usize = 1 << 20;

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

const DUCKDB_SCRIPT: &str = r#"
import sys, time, duckdb
src, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads=1")
t = time.perf_counter()
con.execute(f"""COPY (SELECT * FROM read_json('{src}', format='newline_delimited', columns={{id:'VARCHAR', type:'VARCHAR', actor:'STRUCT(id BIGINT, login VARCHAR)', repo:'STRUCT(id BIGINT, name VARCHAR)', payload:'JSON', public:'BOOLEAN', created_at:'TIMESTAMP', org:'STRUCT(id BIGINT, login VARCHAR)'}})) TO '{out}' (FORMAT parquet)""")
print(time.perf_counter() - t)
"#;

/// Bytes under `dir`, recursively.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return std::fs::metadata(dir).map(|m| m.len()).unwrap_or(0);
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// Times `swelake ingest` and DuckDB (when importable) on one hour file; prints their rows.
/// Returns (swelake seconds, swelake peak RSS MiB, DuckDB seconds).
fn ingest_vs_duckdb(work: &Path, hour: &Path, n: usize, bytes: usize, pin: bool) -> Result<(f64, f64, Option<f64>)> {
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
fn floor_and_bound(hour: &Path, n: usize, bytes: usize, pin: bool) -> Result<(f64, f64)> {
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

pub fn reward(a: &RewardBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work)?;
    let mut cases = String::new();
    crate::files::open_maybe_gz(&a.cases)?.read_to_string(&mut cases)?;
    let n = cases.lines().filter(|l| !l.trim().is_empty()).count();
    let plain = a.work.join("cases.jsonl");
    std::fs::write(&plain, &cases)?;
    let big = a.work.join("cases_repeated.jsonl");
    std::fs::write(&big, cases.repeat(a.repeat))?;
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let pin = have("taskset", "-V");
    let run = |t: usize| -> Result<f64> {
        let out = a.work.join(format!("scored_{t}.jsonl"));
        let (secs, _, _) = timed_child(
            vec![
                exe.clone(),
                "--quiet".into(),
                "reward".into(),
                "--input".into(),
                big.to_string_lossy().into_owned(),
                "--output".into(),
                out.to_string_lossy().into_owned(),
                "--threads".into(),
                t.to_string(),
            ],
            // One thread is measured on one core (where both the reader and the scorer
            // run), as the Python baseline is; all threads run unpinned.
            pin && t == 1,
        )?;
        Ok((n * a.repeat) as f64 / secs)
    };
    let runs = a.runs.max(1);
    let best = |f: &dyn Fn() -> Result<f64>| -> Result<f64> {
        let mut best = 0f64;
        for _ in 0..runs {
            best = best.max(f()?);
        }
        Ok(best)
    };
    let one = best(&|| run(1))?;
    let all = best(&|| run(threads))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/reward_baseline.py");
    let python = || -> Result<f64> {
        let mut cmd = if pin {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        let py = cmd.arg(&script).arg(&plain).output().context("running python3 baseline")?;
        if !py.status.success() {
            bail!("python baseline failed (pip install unidiff?): {}", String::from_utf8_lossy(&py.stderr));
        }
        let stderr = String::from_utf8_lossy(&py.stderr);
        stderr
            .split('=')
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .context("reading the python rate")
    };
    let py_rate = best(&python)?;
    println!("{n} cases ({}x for swelake, 1x for python), best of {runs} runs each", a.repeat);
    println!("{:<40} {:>12}", "", "cases/s");
    println!("{:<40} {py_rate:>12.1}", "python3 difflib (reference algorithm)");
    println!("{:<40} {one:>12.1}", "swelake reward --threads 1");
    println!("{:<40} {all:>12.1}", format!("swelake reward --threads {threads}"));
    println!("\nper thread vs python: {:.0}x (target >= 100x); all threads: {:.0}x", one / py_rate, all / py_rate);
    Ok(())
}

fn git(args: &[&str], dir: &Path) -> Result<Vec<u8>> {
    let out =
        Command::new("git").args(args).current_dir(dir).output().context("running git (the benchmark's baseline)")?;
    if !out.status.success() {
        bail!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.stdout)
}

/// The default corpus: every crate of the cargo registry whose name starts with `prefix`
/// (real source files, already on any machine that built swelake).
fn default_corpus(prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let registry = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|h| h.join("registry/src"));
    if let Some(Ok(indexes)) = registry.map(std::fs::read_dir) {
        for idx in indexes.flatten() {
            if let Ok(crates) = std::fs::read_dir(idx.path()) {
                for c in crates.flatten() {
                    if c.file_name().to_string_lossy().starts_with(prefix) {
                        out.push(c.path());
                    }
                }
            }
        }
    }
    if out.is_empty() {
        out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    }
    out.sort();
    out
}

/// Blobs/s reading every blob of a repository through swelake's snapshot code, next to
/// `git cat-file --batch` on the same list (the floor).
pub fn blobs(a: &BlobsBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work)?;
    let repo_dir = match &a.repo {
        Some(r) => r.clone(),
        None => {
            let corpus = a.corpus.clone().map(|c| vec![c]).unwrap_or_else(|| default_corpus("datafusion"));
            let dir = a.work.join("repo");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            println!(
                "making a repository from the files of {} director(ies), e.g. {}",
                corpus.len(),
                corpus[0].display()
            );
            git(&["init", "-q"], &dir)?;
            for c in &corpus {
                let name = c.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "corpus".into());
                let copy = Command::new("cp").arg("-r").arg(c).arg(dir.join(name)).status()?;
                if !copy.success() {
                    bail!("copying {}", c.display());
                }
            }
            git(&["add", "-A"], &dir)?;
            git(
                &["-c", "user.name=bench", "-c", "user.email=bench@example.org", "commit", "-q", "-m", "corpus"],
                &dir,
            )?;
            git(&["gc", "-q"], &dir)?;
            dir
        }
    };
    let listing = git(&["rev-list", "--objects", "--all"], &repo_dir)?;
    let oids: Vec<String> = String::from_utf8_lossy(&listing)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let mut check = Command::new("git")
        .args(["cat-file", "--batch-check=%(objecttype) %(objectname)"])
        .current_dir(&repo_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    check.stdin.take().context("stdin")?.write_all((oids.join("\n") + "\n").as_bytes())?;
    let out = check.wait_with_output()?;
    let blobs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("blob ").map(str::to_string))
        .collect();
    let list = std::fs::canonicalize(&a.work)?.join("blobs.txt");
    std::fs::write(&list, blobs.join("\n") + "\n")?;
    println!("{} blobs in {}", blobs.len(), repo_dir.display());

    // Baseline: git cat-file --batch, output discarded.
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("git cat-file --batch < '{}' > /dev/null", list.display()))
        .current_dir(&repo_dir)
        .status()?;
    if !status.success() {
        bail!("git cat-file --batch failed");
    }
    let cat = t.elapsed().as_secs_f64();

    // swelake: open the repository and read every blob as the snapshot job does.
    let t = Instant::now();
    let repo = git2::Repository::open(&repo_dir)?;
    let mut bytes = 0usize;
    for b in &blobs {
        let oid = git2::Oid::from_str(b)?;
        let (content, _binary) = crate::git::read_blob(&repo, oid).map_err(|f| anyhow::anyhow!(f.message))?;
        bytes += content.len();
    }
    let ours = t.elapsed().as_secs_f64();
    let n = blobs.len() as f64;
    println!("\n{:<32} {:>9} {:>12} {:>10}", "", "seconds", "blobs/s", "MB/s");
    println!("{:<32} {cat:>9.3} {:>12.0} {:>10.0}", "git cat-file --batch (floor)", n / cat, bytes as f64 / 1e6 / cat);
    println!("{:<32} {ours:>9.3} {:>12.0} {:>10.0}", "swelake (libgit2)", n / ours, bytes as f64 / 1e6 / ours);
    println!("\nswelake / cat-file: {:.2}x (target >= 0.5x)", cat / ours);
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

#[derive(Debug, Clone)]
pub struct RelevanceBenchOptions {
    pub lake: String,
    pub repo_name: String,
    pub repo_url: String,
    pub cache_dir: PathBuf,
    /// Kept PRs ranked (spread over the repository's history).
    pub prs: usize,
    /// Encoder threads, both sides (and Python's).
    pub threads: usize,
    pub config: Option<PathBuf>,
    /// Also compare the sides on every leave-one-out case of the lake's merged PRs.
    pub every_case: bool,
    pub work: PathBuf,
}

const ORT_BASELINE: &str = r#"
import json, sys, time
import numpy as np
import onnxruntime as ort
model, ids_file, threads, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = json.load(open(ids_file))
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
t = time.perf_counter()
out = [None] * len(ids)
for s in range(0, len(order), batch):
    b = order[s:s + batch]
    n = max(len(ids[i]) for i in b)
    x = np.zeros((len(b), n), dtype=np.int64)
    m = np.zeros((len(b), n), dtype=np.int64)
    for r, i in enumerate(b):
        x[r, :len(ids[i])] = ids[i]
        m[r, :len(ids[i])] = 1
    h = sess.run(["last_hidden_state"], {"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)})[0]
    v = (h * m[:, :, None]).sum(1) / m.sum(1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    for r, i in enumerate(b):
        out[i] = v[r]
dt = time.perf_counter() - t
print(json.dumps({"chunks": len(ids), "seconds": dt}))
"#;

/// `swelake bench relevance`: the relevance stage before re-ranking against now on the same
/// PRs (PRs/s, chunks/s, embedding cache hit rate, leave-one-out recall of both), and Python
/// onnxruntime encoding the chunks the stage now embeds, when python3 has it.
pub async fn relevance(a: &RelevanceBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work).with_context(|| format!("creating {}", a.work.display()))?;
    let lake = crate::lake::Lake::open(&a.lake)?;
    let cfg = crate::jobs::CurationConfig::load(a.config.as_deref())?.relevance;
    let mirrors = crate::git::Mirrors::new(a.repo_url.clone(), a.cache_dir.clone());
    let repo = mirrors.open(&a.repo_name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
    let enc = crate::relevance::encoder::Encoder::load(a.threads)?;
    let sides = crate::relevance::bench_sides(&lake, &repo, &a.repo_name, a.prs, &cfg, &enc, a.every_case).await?;
    println!(
        "relevance of {} kept PRs of {} ({} encoder threads), each side from an empty embedding cache\n",
        sides.first().map_or(0, |s| s.prs),
        a.repo_name,
        a.threads
    );
    println!(
        "{:<40} {:>8} {:>8} {:>9} {:>9} {:>8}  {:>22}",
        "", "s/PR", "PRs/s", "chunks", "chunks/s", "hit rate", "LOO recall@1/5/10"
    );
    for s in &sides {
        println!(
            "{:<40} {:>8.2} {:>8.3} {:>9} {:>9.1} {:>7.1}%  {:>6.3} {:>6.3} {:>6.3} ({} cases)",
            s.name,
            s.seconds / s.prs.max(1) as f64,
            s.prs_per_second,
            s.embedded_chunks,
            s.chunks_per_second,
            100.0 * s.embedding_cache_hit_rate,
            s.loo_recall[0],
            s.loo_recall[1],
            s.loo_recall[2],
            s.loo_cases
        );
    }
    if let [before, now] = &sides[..] {
        if let Some(((better, worse, same), mrr_before, mrr_now)) =
            crate::relevance::paired_ranks(&before.loo_ranks, &now.loo_ranks)
        {
            println!(
                "case by case: the hidden file ranks higher now in {better}, lower in {worse}, the same in {same}; mean reciprocal rank {mrr_before:.3} before, {mrr_now:.3} now"
            );
        }
        if a.every_case {
            println!("\nevery leave-one-out case of the lake's merged PRs of {}:", a.repo_name);
            for s in &sides {
                let r = crate::relevance::recall_of(&s.every_case_ranks);
                println!(
                    "{:<40} recall@1/5/10 {:>6.3} {:>6.3} {:>6.3} ({} cases)",
                    s.name,
                    r[0],
                    r[1],
                    r[2],
                    s.every_case_ranks.len()
                );
            }
            if let Some(((better, worse, same), mrr_before, mrr_now)) =
                crate::relevance::paired_ranks(&before.every_case_ranks, &now.every_case_ranks)
            {
                println!(
                    "case by case: higher now in {better}, lower in {worse}, the same in {same}; mean reciprocal rank {mrr_before:.3} before, {mrr_now:.3} now"
                );
            }
        }
        println!("\nspeed-up per PR: {:.1}x", now.prs_per_second / before.prs_per_second.max(1e-12));
        let rust_rate = now.chunks_per_second;
        let has_ort = Command::new("python3")
            .args(["-c", "import onnxruntime, numpy"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !has_ort {
            println!(
                "{:<40} (python3 cannot import onnxruntime and numpy: pip install onnxruntime numpy)",
                "python onnxruntime"
            );
            return Ok(());
        }
        // The same chunks, tokenised by swelake, so both sides run the same model on the same ids.
        let refs: Vec<&str> = now.chunk_texts.iter().map(|s| s.as_str()).collect();
        let ids = enc.token_ids(&refs)?;
        let ids_file = a.work.join("chunk_ids.json");
        std::fs::write(&ids_file, serde_json::to_vec(&ids)?)?;
        let script = a.work.join("ort_baseline.py");
        std::fs::write(&script, ORT_BASELINE)?;
        let model = crate::models::fetch(&crate::models::MINILM_MODEL)?;
        let out = Command::new("python3")
            .arg(&script)
            .arg(&model)
            .arg(&ids_file)
            .arg(a.threads.to_string())
            .arg("32")
            .output()
            .context("running python3 onnxruntime")?;
        if !out.status.success() {
            bail!("python onnxruntime baseline failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading the baseline's output")?;
        let py_rate = v["chunks"].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(1.0).max(1e-9);
        println!(
            "encoding the {} chunks: swelake {:.1} chunks/s, python onnxruntime {:.1} chunks/s (ratio {:.2})",
            now.chunk_texts.len(),
            rust_rate,
            py_rate,
            rust_rate / py_rate.max(1e-12)
        );
    }
    Ok(())
}

/// Options of `swelake bench jobs`.
#[derive(Debug, Clone)]
pub struct JobsBenchOptions {
    pub hours: usize,
    pub copies: usize,
    /// Real hour files to copy; default `../shared/gharchive`, else `tests/data/gharchive`.
    pub sources: Option<PathBuf>,
    pub first_hour: String,
    pub work: PathBuf,
    /// Also run the jobs on Ballista with 1 and 2 executors on loopback.
    pub ballista: bool,
    pub python: String,
    /// Runs of each PR job on both sides of the DuckDB comparison; the median counts.
    pub repeat: usize,
}

/// The PR jobs compared with DuckDB.
const PR_JOBS: [&str; 2] = ["pr_timeline", "pull_requests"];

/// The SQL jobs the benchmark times, in dependency order (filters needs snapshots: git).
const BENCH_JOBS: [&str; 4] = ["pr_timeline", "pull_requests", "issues", "pr_issue_links"];

struct JobFigure {
    step: String,
    engine: String,
    seconds: f64,
    rows: u64,
    peak_mib: Option<f64>,
}

/// (rows_out, seconds) of `job` in a `run --json` line.
fn job_of_run(out: &str, job: &str) -> Result<(u64, f64)> {
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .with_context(|| format!("run --json printed {out:?}"))?;
    let j = v["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["job"] == job))
        .with_context(|| format!("no `{job}` in {v}"))?;
    if j["outcome"] != "done" {
        bail!("{job}: {}", j);
    }
    Ok((j["rows_out"].as_u64().unwrap_or(0), j["seconds"].as_f64().unwrap_or(0.0)))
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn runs_list(xs: &[f64]) -> String {
    xs.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ")
}

/// A copy of a table directory whose Parquet files are hard links (data files are never
/// rewritten in place); the log is copied, so the copy's commits stay its own.
fn link_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            link_dir(&src, &dst)?;
        } else if src.extension().is_some_and(|x| x == "parquet") {
            std::fs::hard_link(&src, &dst).or_else(|_| std::fs::copy(&src, &dst).map(|_| ()))?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// Scheduler and executors on loopback, killed on drop.
struct LoopbackCluster(Vec<std::process::Child>, String);

impl Drop for LoopbackCluster {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0")?;
        let p = a.local_addr()?.port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return Ok(p);
        }
    }
}

fn wait_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listened on 127.0.0.1:{port} within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

fn start_loopback(exe: &Path, executors: usize, work: &Path) -> Result<LoopbackCluster> {
    let quiet = || std::process::Stdio::null();
    let port = free_port()?;
    let mut c = LoopbackCluster(Vec::new(), format!("df://127.0.0.1:{port}"));
    c.0.push(
        Command::new(exe)
            .args(["-q", "ballista", "scheduler", "--bind", &format!("127.0.0.1:{port}")])
            .stdout(quiet())
            .stderr(quiet())
            .spawn()?,
    );
    wait_port(port)?;
    for i in 0..executors {
        let p = free_port()?;
        c.0.push(
            Command::new(exe)
                .args(["-q", "ballista", "executor", "--scheduler", &format!("127.0.0.1:{port}")])
                .args(["--bind", &format!("127.0.0.1:{p}"), "--concurrent-tasks", "1"])
                .arg("--work-dir")
                .arg(work.join(format!("executor-{i}")))
                .stdout(quiet())
                .stderr(quiet())
                .spawn()?,
        );
        wait_port(p)?;
    }
    Ok(c)
}

/// The real hour files the generators copy: those of `dir`, else of `../shared/gharchive`,
/// else of `tests/data/gharchive`.
fn real_hours(dir: Option<&Path>) -> Result<(PathBuf, Vec<PathBuf>)> {
    let src_dir = match dir {
        Some(d) => d.to_path_buf(),
        None => ["../shared/gharchive", "tests/data/gharchive"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .context("no source hours: give --sources DIR (real GH Archive hour files)")?,
    };
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&src_dir)
        .with_context(|| format!("listing {}", src_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".json.gz") || p.to_string_lossy().ends_with(".json"))
        .collect();
    sources.sort();
    if sources.is_empty() {
        bail!("no hour files in {}", src_dir.display());
    }
    Ok((src_dir, sources))
}

/// `swelake bench jobs`: a generated day through ingest and the SQL jobs, on the local engine
/// (each step its own process, so each has its own peak RSS), on Ballista with one and two
/// single-slot executors, and in DuckDB over the same events files.
pub async fn jobs(o: &JobsBenchOptions) -> Result<()> {
    let exe = std::env::current_exe()?;
    let (src_dir, sources) = real_hours(o.sources.as_deref())?;
    for d in ["hours", "local", "all", "b1", "b2", "cluster"] {
        let _ = std::fs::remove_dir_all(o.work.join(d));
    }
    std::fs::create_dir_all(&o.work)?;
    let hours = o.work.join("hours");
    let t = Instant::now();
    let g = crate::samples::GenerateOptions {
        sources,
        first_hour: o.first_hour.clone(),
        hours: o.hours,
        copies: o.copies,
        hours_before: 0,
    };
    let files = crate::samples::generate_hours(&g, &hours)?;
    let bytes: u64 = files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
    eprintln!(
        "generated {} hour files ({:.1} MB gzipped) from {} in {:.1}s",
        files.len(),
        bytes as f64 / 1e6,
        src_dir.display(),
        t.elapsed().as_secs_f64()
    );
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let exe_s = s(&exe);
    let mut figures: Vec<JobFigure> = Vec::new();

    let local = o.work.join("local");
    let (secs, rss, out) = timed_child(
        vec![
            exe_s.clone(),
            "-q".into(),
            "ingest".into(),
            "--source".into(),
            s(&hours),
            "--lake".into(),
            s(&local),
            "--json".into(),
        ],
        false,
    )?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| format!("ingest printed {out:?}"))?;
    let events = v["events_written"].as_u64().unwrap_or(0);
    figures.push(JobFigure {
        step: "ingest".into(),
        engine: "local".into(),
        seconds: secs,
        rows: events,
        peak_mib: Some(rss),
    });
    let mut local_rows = BTreeMap::new();
    for job in BENCH_JOBS {
        let (_, rss, out) = timed_child(
            vec![exe_s.clone(), "-q".into(), "run".into(), job.into(), "--lake".into(), s(&local), "--json".into()],
            false,
        )?;
        let (rows, secs) = job_of_run(&out, job)?;
        local_rows.insert(job, rows);
        figures.push(JobFigure { step: job.into(), engine: "local".into(), seconds: secs, rows, peak_mib: Some(rss) });
    }
    // More runs of the PR jobs, each over a fresh lake of the same events (files linked, not
    // copied): on a shared 2-core machine one run of a 2-second job varies by ±20%, so the
    // comparison with DuckDB takes the median of `repeat` runs on each side.
    let mut pr_runs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for job in PR_JOBS {
        let first = figures.iter().find(|f| f.step == job).map(|f| f.seconds).unwrap_or(0.0);
        pr_runs.insert(job, vec![first]);
    }
    for r in 1..o.repeat {
        let lake = o.work.join(format!("repeat{r}"));
        let _ = std::fs::remove_dir_all(&lake);
        link_dir(&local.join("events"), &lake.join("events"))?;
        for job in PR_JOBS {
            let (_, _, out) = timed_child(
                vec![exe_s.clone(), "-q".into(), "run".into(), job.into(), "--lake".into(), s(&lake), "--json".into()],
                false,
            )?;
            let (rows, secs) = job_of_run(&out, job)?;
            if rows != local_rows[job] {
                bail!("{job} wrote {rows} rows on repeat {r}, {} the first time", local_rows[job]);
            }
            pr_runs.get_mut(job).expect("inserted above").push(secs);
        }
        let _ = std::fs::remove_dir_all(&lake);
    }

    // The whole pipeline's SQL part in one process, as a scheduled run does it.
    let (secs, rss, _) = timed_child(
        vec![
            exe_s.clone(),
            "-q".into(),
            "run".into(),
            "--all".into(),
            "--source".into(),
            s(&hours),
            "--lake".into(),
            s(&o.work.join("all")),
            "--json".into(),
        ],
        false,
    )?;
    figures.push(JobFigure {
        step: "run --all".into(),
        engine: "local, one process".into(),
        seconds: secs,
        rows: events,
        peak_mib: Some(rss),
    });

    // Ballista: `repeat` runs of the four jobs per cluster size, each over a fresh lake of the
    // same events; the medians of the totals are compared (one run varies by +-20% here).
    let mut ballista_runs: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    if o.ballista {
        for n in [1usize, 2] {
            let cluster = start_loopback(&exe, n, &o.work.join("cluster"))?;
            for r in 0..o.repeat.max(1) {
                let lake = o.work.join(format!("b{n}-{r}"));
                let _ = std::fs::remove_dir_all(&lake);
                link_dir(&local.join("events"), &lake.join("events"))?;
                let mut total = 0.0;
                for job in BENCH_JOBS {
                    let (_, _, out) = timed_child(
                        vec![
                            exe_s.clone(),
                            "-q".into(),
                            "run".into(),
                            job.into(),
                            "--lake".into(),
                            s(&lake),
                            "--json".into(),
                            "--engine".into(),
                            "ballista".into(),
                            "--scheduler".into(),
                            cluster.1.clone(),
                        ],
                        false,
                    )?;
                    let (rows, secs) = job_of_run(&out, job)?;
                    if rows != local_rows[job] {
                        bail!(
                            "{job} on Ballista ({n} executors) wrote {rows} rows, the local engine {}",
                            local_rows[job]
                        );
                    }
                    total += secs;
                    if r == 0 {
                        figures.push(JobFigure {
                            step: job.into(),
                            engine: format!("ballista, {n} executor(s) x 1 slot"),
                            seconds: secs,
                            rows,
                            peak_mib: None,
                        });
                    }
                }
                ballista_runs.entry(n).or_default().push(total);
                let _ = std::fs::remove_dir_all(&lake);
            }
            drop(cluster);
        }
    }

    // DuckDB over exactly the events files of the local lake's version.
    let mut duck: Option<serde_json::Value> = None;
    let script = Path::new("bench/duckdb_pr_jobs.py");
    if !script.is_file() {
        eprintln!("DuckDB baseline skipped: run from the repository root (bench/duckdb_pr_jobs.py)");
    } else if Command::new(&o.python)
        .args(["-c", "import duckdb"])
        .stderr(std::process::Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("DuckDB baseline skipped: {} has no duckdb (pip install duckdb)", o.python);
    } else {
        let lake = crate::lake::Lake::open(&s(&local))?;
        let table = lake.open_table("events").await?;
        let list: Vec<String> =
            table.get_file_uris()?.map(|u| u.strip_prefix("file://").map(str::to_string).unwrap_or(u)).collect();
        let list_file = o.work.join("events-files.txt");
        std::fs::write(&list_file, list.join("\n"))?;
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let (_, rss, out) = timed_child(
            vec![o.python.clone(), s(script), s(&list_file), threads.to_string(), o.repeat.to_string()],
            false,
        )?;
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).with_context(|| format!("duckdb printed {out:?}"))?;
        for job in ["pr_timeline", "pull_requests"] {
            let rows = v[format!("{job}_rows")].as_u64().unwrap_or(0);
            if rows != local_rows[job] {
                bail!("DuckDB's {job} has {rows} rows, swelake's {}: the port is not the same query", local_rows[job]);
            }
            figures.push(JobFigure {
                step: job.into(),
                engine: format!("duckdb {}", v["duckdb_version"].as_str().unwrap_or("")),
                seconds: v[format!("{job}_seconds")].as_f64().unwrap_or(0.0),
                rows,
                peak_mib: Some(rss),
            });
        }
        let ctx = lake.session().await?;
        let merged: Vec<i64> = crate::query::rows(&ctx, "SELECT count(*) FROM pull_requests WHERE merged").await?;
        if v["pull_requests_merged"].as_i64() != merged.first().copied() {
            bail!("DuckDB counts {} merged PRs, swelake {:?}", v["pull_requests_merged"], merged.first());
        }
        duck = Some(v);
    }

    println!("bench jobs: {} hours x {} copies of {} = {events} events", o.hours, o.copies, src_dir.display());
    println!("{:<16} {:<34} {:>9} {:>11} {:>12} {:>13}", "step", "engine", "seconds", "rows", "rows/s", "peak RSS MiB");
    for f in &figures {
        let rate = if f.seconds > 0.0 { f.rows as f64 / f.seconds } else { 0.0 };
        let peak = f.peak_mib.map_or("-".to_string(), |m| format!("{m:.0}"));
        println!("{:<16} {:<34} {:>9.2} {:>11} {:>12.0} {:>13}", f.step, f.engine, f.seconds, f.rows, rate, peak);
    }
    if let Some(v) = &duck {
        // Two DuckDB baselines: its result as an in-memory table, and Parquet in and Parquet
        // out as swelake's jobs run (pull_requests reading pr_timeline's file, not DuckDB's
        // own table). Ours always includes the Parquet write and the Delta commit.
        let runs = |key: String| -> Vec<f64> {
            v[key].as_array().map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect()).unwrap_or_default()
        };
        let mut ours = 0.0;
        let (mut memory, mut parquet) = (0.0, 0.0);
        for job in PR_JOBS {
            let local = &pr_runs[job];
            let (in_memory, to_parquet) = (runs(format!("{job}_runs")), runs(format!("{job}_parquet_runs")));
            let rows = v[format!("{job}_parquet_rows")].as_u64().unwrap_or(0);
            if rows != local_rows[job] {
                bail!("DuckDB's {job} Parquet file has {rows} rows, swelake's table {}", local_rows[job]);
            }
            let (m_ours, m_memory, m_parquet) = (median(local), median(&in_memory), median(&to_parquet));
            println!(
                "{job:<16} median of {} runs: local {m_ours:.2}s ({}), DuckDB into memory {m_memory:.2}s ({}), DuckDB into Parquet {m_parquet:.2}s ({})",
                local.len(),
                runs_list(local),
                runs_list(&in_memory),
                runs_list(&to_parquet)
            );
            ours += m_ours;
            memory += m_memory;
            parquet += m_parquet;
        }
        println!(
            "PR jobs (pr_timeline + pull_requests), medians: local {ours:.2}s; DuckDB Parquet to Parquet {parquet:.2}s = {:.2}x DuckDB's speed; DuckDB into an in-memory table {memory:.2}s = {:.2}x (target >= 1x)",
            parquet / ours.max(1e-9),
            memory / ours.max(1e-9)
        );
    }
    if let (Some(one), Some(two)) = (ballista_runs.get(&1), ballista_runs.get(&2)) {
        let (m1, m2) = (median(one), median(two));
        println!(
            "Ballista, the four jobs, median of {} runs: 1 executor {m1:.2}s ({}), 2 executors {m2:.2}s ({}) = {:.2}x (target >= 1.5x)",
            one.len(),
            runs_list(one),
            runs_list(two),
            m1 / m2.max(1e-9)
        );
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct BackfillBenchOptions {
    pub days: usize,
    pub copies: usize,
    pub hours_per_day: usize,
    /// Real hour files to copy; default `../shared/gharchive`, else `tests/data/gharchive`.
    pub sources: Option<PathBuf>,
    pub first_day: chrono::NaiveDate,
    pub work: PathBuf,
    /// Keep the lake at the end (it is deleted otherwise: 30 days take ~33 GB).
    pub keep_lake: bool,
}

/// One day of a backfill: what `run --all` did and what it cost.
struct BackfillDay {
    day: chrono::NaiveDate,
    events: u64,
    seconds: f64,
    peak_mib: f64,
    job_seconds: BTreeMap<String, f64>,
    lake_bytes: u64,
}

/// `swelake bench backfill`: days of generated GH Archive through `run --all`, one day at a
/// time into one growing lake, as a backfill would run them: generate the day's hour files,
/// run every job over them (one process, its peak RSS measured), delete the day's input. The
/// point is the peak of the last day next to the first: memory bounded by a partition, not by
/// the lake.
pub fn backfill(o: &BackfillBenchOptions) -> Result<()> {
    let exe = std::env::current_exe()?;
    let (src_dir, sources) = real_hours(o.sources.as_deref())?;
    let lake = o.work.join("lake");
    let hours = o.work.join("hours");
    let _ = std::fs::remove_dir_all(&lake);
    let _ = std::fs::remove_dir_all(&hours);
    std::fs::create_dir_all(&o.work)?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    println!(
        "bench backfill: {} days x {} hours x {} copies of {} into {}",
        o.days,
        o.hours_per_day,
        o.copies,
        src_dir.display(),
        lake.display()
    );
    println!(
        "{:>4} {:<10} {:>10} {:>12} {:>8} {:>8} {:>13} {:>9} {:>9}",
        "day", "date", "events", "lake events", "seconds", "ingest", "SQL jobs", "peak MiB", "lake GB"
    );
    let mut days: Vec<BackfillDay> = Vec::new();
    let mut total_events = 0u64;
    for d in 0..o.days {
        let day = o.first_day + chrono::Duration::days(d as i64);
        let g = crate::samples::GenerateOptions {
            sources: sources.clone(),
            first_hour: format!("{}-0", day.format("%Y-%m-%d")),
            hours: o.hours_per_day,
            copies: o.copies,
            hours_before: d * o.hours_per_day,
        };
        crate::samples::generate_hours(&g, &hours)?;
        let (secs, peak, out) = timed_child(
            vec![s(&exe), "-q".into(), "run".into(), "--all".into(), "--source".into(), s(&hours)]
                .into_iter()
                .chain(["--lake".into(), s(&lake), "--json".into()])
                .collect(),
            false,
        )
        .with_context(|| format!("day {} ({day})", d + 1))?;
        std::fs::remove_dir_all(&hours)?;
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or_default())
            .with_context(|| format!("run --json printed {out:?}"))?;
        if v["ok"] != true {
            bail!("day {} ({day}): run --all failed: {}", d + 1, v["error"]);
        }
        let mut job_seconds = BTreeMap::new();
        let mut events = 0;
        for j in v["jobs"].as_array().into_iter().flatten() {
            let name = j["job"].as_str().unwrap_or_default().to_string();
            if name == "ingest" {
                events = j["rows_out"].as_u64().unwrap_or(0);
            }
            if j["outcome"] == "done" {
                job_seconds.insert(name, j["seconds"].as_f64().unwrap_or(0.0));
            }
        }
        total_events += events;
        let row = BackfillDay { day, events, seconds: secs, peak_mib: peak, job_seconds, lake_bytes: dir_bytes(&lake) };
        let sql: f64 = row.job_seconds.iter().filter(|(k, _)| *k != "ingest").map(|(_, v)| v).sum();
        println!(
            "{:>4} {:<10} {:>10} {:>12} {:>8.1} {:>8.1} {:>13.1} {:>9.0} {:>9.1}",
            d + 1,
            day,
            row.events,
            total_events,
            row.seconds,
            row.job_seconds.get("ingest").copied().unwrap_or(0.0),
            sql,
            row.peak_mib,
            row.lake_bytes as f64 / 1e9
        );
        days.push(row);
    }
    if let (Some(first), Some(last)) = (days.first(), days.last()) {
        let max = days.iter().max_by(|a, b| a.peak_mib.total_cmp(&b.peak_mib)).expect("a day");
        println!(
            "peak RSS: first day {:.0} MiB, last day {:.0} MiB ({:.2}x the first), highest {:.0} MiB on {} (target <= 2048 MiB on every day)",
            first.peak_mib,
            last.peak_mib,
            last.peak_mib / first.peak_mib.max(1.0),
            max.peak_mib,
            max.day
        );
        let per_job =
            |r: &BackfillDay| r.job_seconds.iter().map(|(k, v)| format!("{k} {v:.1}s")).collect::<Vec<_>>().join(", ");
        println!("first day's jobs: {}", per_job(first));
        println!("last day's jobs:  {}", per_job(last));
    }
    if !o.keep_lake {
        std::fs::remove_dir_all(&lake)?;
    }
    Ok(())
}
