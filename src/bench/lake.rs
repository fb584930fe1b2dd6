//! `bench lake`: ingest of generated hours into a local lake and into an S3-compatible store
//! (moto on loopback), with one and two hours at a time.

use std::path::PathBuf;

use super::cluster::{create_bucket, start_moto};
use super::ingest::make_hour;
use super::{have, timed_child, IngestBenchOptions};
use anyhow::Result;

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
