//! `bench project`: each stage's unit cost measured on this machine, multiplied by SWE-RL's
//! counts, into machine-hours per stage and the wall time on N machines.

use std::path::{Path, PathBuf};

use super::{jobs, timed_child};
use anyhow::{bail, Context, Result};

/// Options of `swelake bench project`.
#[derive(Debug, Clone)]
pub struct ProjectBenchOptions {
    /// A local lake of a real history after `run filters` (the git stages' costs).
    pub lake: PathBuf,
    pub repo_url: String,
    pub cache_dir: PathBuf,
    /// Generated archive: hours and copies of the real source hours per hour.
    pub hours: usize,
    pub copies: usize,
    pub sources: Option<PathBuf>,
    pub machines: usize,
    pub scale: Scale,
    pub work: PathBuf,
    /// Kept PRs the verify stage is measured on (0: leave the stage out).
    pub verify_prs: usize,
}

/// The corpus the projection is made for (SWE-RL's, by default).
#[derive(Debug, Clone)]
pub struct Scale {
    pub days: f64,
    pub events_per_day: f64,
    pub merged_prs: f64,
    pub kept_prs: f64,
}

/// One stage's measurement and what it projects to.
#[derive(Clone)]
struct Stage {
    name: &'static str,
    /// Units measured, seconds they took, and the unit's name.
    units: f64,
    seconds: f64,
    unit: &'static str,
    /// Units at scale.
    at_scale: f64,
}

impl Stage {
    fn machine_hours(&self) -> f64 {
        self.seconds / self.units.max(1e-9) * self.at_scale / 3600.0
    }
}

/// `notes` of `job` in a `run --json` line.
fn notes_of(out: &str, job: &str) -> Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .with_context(|| format!("run --json printed {out:?}"))?;
    v["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["job"] == job))
        .map(|j| j["notes"].clone())
        .with_context(|| format!("no `{job}` in {v}"))
}

/// `swelake bench project`: ingest and the SQL jobs on a generated day (events/s, seconds
/// per million events), the git stages on a copy of a real history's lake (snapshots in PRs/s,
/// relevance and seed in seconds per kept PR, relevance from a cold lake with its fit), then
/// each multiplied by the corpus' counts.
pub fn project(o: &ProjectBenchOptions) -> Result<()> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let _ = std::fs::remove_dir_all(&o.work);
    std::fs::create_dir_all(&o.work)?;
    let run = |args: &[&str]| -> Result<(f64, String)> {
        let mut v = vec![exe.clone(), "-q".to_string()];
        v.extend(args.iter().map(|a| a.to_string()));
        let (secs, _, out) = timed_child(v, false)?;
        Ok((secs, out))
    };

    // The archive side: a generated day of real events through ingest and the SQL jobs.
    let (_, sources) = jobs::real_hours(o.sources.as_deref())?;
    let g = crate::synthetic::SynthOptions {
        sources,
        first_hour: "2025-03-01-0".into(),
        hours: o.hours,
        copies: o.copies,
        hours_before: 0,
    };
    let hours = o.work.join("hours");
    crate::synthetic::synthesize_hours(&g, &hours)?;
    let day = o.work.join("day");
    let (ingest_s, out) = run(&["ingest", "--source", &s(&hours), "--lake", &s(&day), "--json"])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| format!("ingest printed {out:?}"))?;
    let events = v["events_written"].as_f64().unwrap_or(0.0);
    let mut sql_s = 0.0;
    for job in jobs::BENCH_JOBS {
        let (_, out) = run(&["run", job, "--lake", &s(&day), "--json"])?;
        sql_s += jobs::job_of_run(&out, job)?.1;
    }
    eprintln!("archive: {events} events, ingest {ingest_s:.1} s, SQL jobs {sql_s:.1} s");

    // The git side: a copy of the history's lake (data files linked), each stage redone.
    let hist = o.work.join("history");
    jobs::link_dir(&o.lake, &hist)?;
    for t in
        [crate::relevance::PR_RELEVANT_FILES, crate::relevance::BLOB_EMBEDDINGS, crate::relevance::RELEVANCE_MODELS]
    {
        let _ = std::fs::remove_dir_all(hist.join(t));
    }
    let git = ["--lake", &s(&hist), "--repo-url", &o.repo_url, "--cache-dir", &s(&o.cache_dir), "--json"];
    let with = |first: &[&str]| -> Vec<String> { first.iter().chain(git.iter()).map(|x| x.to_string()).collect() };
    let call =
        |args: Vec<String>| -> Result<(f64, String)> { run(&args.iter().map(String::as_str).collect::<Vec<_>>()) };
    // Warm the mirrors first: clone time is outside the projection (an assumption it states).
    call(with(&["run", "snapshots", "--force"]))?;
    let (_, out) = call(with(&["run", "snapshots", "--force"]))?;
    let (_, snap_s) = jobs::job_of_run(&out, "snapshots")?;
    let snapped = notes_of(&out, "snapshots")?["prs_snapshotted"].as_f64().unwrap_or(0.0);
    let (_, out) = call(with(&["run", "relevance"]))?;
    let (_, rel_s) = jobs::job_of_run(&out, "relevance")?;
    let ranked = notes_of(&out, "relevance")?["prs_ranked"].as_f64().unwrap_or(0.0);
    let (_, out) = call(with(&["run", "seed"]))?;
    let (_, seed_s) = jobs::job_of_run(&out, "seed")?;
    if ranked == 0.0 || snapped == 0.0 {
        bail!("the lake at {} has no kept, snapshotted PRs to measure the git stages on", o.lake.display());
    }
    // verify on a sample of kept PRs, environments built from the registries (a cold cache):
    // its cost is per kept PR, those without a test change included (they cost next to nothing).
    let mut verify = None;
    if o.verify_prs > 0 {
        let cfg = o.work.join("verify.toml");
        std::fs::write(
            &cfg,
            format!("[verify]\ndir = {:?}\nmax_prs_per_run = {}\n", s(&o.work.join("verify")), o.verify_prs),
        )?;
        let (_, out) = call(with(&["run", "verify", "--config", &s(&cfg)]))?;
        let (_, verify_s) = jobs::job_of_run(&out, "verify")?;
        let n = notes_of(&out, "verify")?["prs_verified_now"].as_f64().unwrap_or(0.0);
        verify = Some((n, verify_s));
    }

    let sc = &o.scale;
    let total_events = sc.days * sc.events_per_day;
    let stages = [
        Stage { name: "ingest", units: events, seconds: ingest_s, unit: "events", at_scale: total_events },
        Stage { name: "PR jobs (SQL)", units: events, seconds: sql_s, unit: "events", at_scale: total_events },
        Stage { name: "snapshots", units: snapped, seconds: snap_s, unit: "merged PRs", at_scale: sc.merged_prs },
        Stage {
            name: "relevance (cold, fit included)",
            units: ranked,
            seconds: rel_s,
            unit: "kept PRs",
            at_scale: sc.kept_prs,
        },
        Stage { name: "seed", units: ranked, seconds: seed_s, unit: "kept PRs", at_scale: sc.kept_prs },
    ];
    let mut stages = stages.to_vec();
    if let Some((n, secs)) = verify {
        stages.push(Stage {
            name: "verify (environments built, 3 runs a side)",
            units: n,
            seconds: secs,
            unit: "kept PRs",
            at_scale: sc.kept_prs,
        });
    }
    println!("{}", render(&stages, o.machines, sc));
    Ok(())
}

fn render(stages: &[Stage], machines: usize, sc: &Scale) -> String {
    let mut t = format!(
        "Projection to {:.0} days of GH Archive ({:.1}M events a day), {:.1}M merged PRs, {:.0}k kept PRs, on {machines} machines like this one\n\n",
        sc.days,
        sc.events_per_day / 1e6,
        sc.merged_prs / 1e6,
        sc.kept_prs / 1e3
    );
    t.push_str("| stage | measured here | unit cost | units at scale | machine-hours | hours on the machines |\n|---|---|---|---|---|---|\n");
    let mut total = 0.0;
    for s in stages {
        let mh = s.machine_hours();
        total += mh;
        let rate = s.units / s.seconds.max(1e-9);
        let cost = if rate >= 10.0 {
            format!("{rate:.0} {}/s", s.unit)
        } else {
            format!("{:.2} s per {}", 1.0 / rate, s.unit.trim_end_matches('s'))
        };
        t.push_str(&format!(
            "| {} | {:.0} {} in {:.1} s | {cost} | {:.3e} | {mh:.0} | {:.1} |\n",
            s.name,
            s.units,
            s.unit,
            s.seconds,
            s.at_scale,
            mh / machines as f64
        ));
    }
    t.push_str(&format!(
        "| **total** | | | | **{total:.0}** | **{:.1}** ({}) |\n",
        total / machines as f64,
        if total / machines as f64 <= 24.0 { "within 24 h" } else { "over 24 h" }
    ));
    t.push_str(
        "\nAssumptions: git clone time is left out (mirrors warm); work divides evenly over the machines \
         (days for ingest and the SQL jobs, repositories for the git stages); the day's events are \
         generated copies of real hours, the git stages measured on one real history.\n",
    );
    t
}
