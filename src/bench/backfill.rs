//! `bench backfill`: day after day into one lake, `run --all`'s peak RSS per day.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::jobs::real_hours;
use super::{dir_bytes, timed_child};
use anyhow::{bail, Context, Result};

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
pub(super) struct BackfillDay {
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
        let g = crate::synthetic::SynthOptions {
            sources: sources.clone(),
            first_hour: format!("{}-0", day.format("%Y-%m-%d")),
            hours: o.hours_per_day,
            copies: o.copies,
            hours_before: d * o.hours_per_day,
        };
        crate::synthetic::synthesize_hours(&g, &hours)?;
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
