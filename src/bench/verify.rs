//! `bench verify`: the verify stage on a copy of a real history's lake, twice — first with no
//! environment built (each resolved and installed from the registries), then again (`--force`)
//! with every environment reused from the cache: seconds per instance, the share of
//! environments reused, the cores the machine kept busy, and the verdicts by status. With
//! `--jobs N` the same twice more with N PRs at once (a cache of their own, so cold is cold),
//! and whether both give the same `pr_verification` (durations aside).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use super::jobs;

/// Options of `swelake bench verify`.
#[derive(Debug, Clone)]
pub struct VerifyBenchOptions {
    /// A local lake of a real history after `swelake run filters` (kept, snapshotted PRs).
    pub lake: PathBuf,
    pub repo_url: String,
    pub cache_dir: PathBuf,
    /// PRs to verify (the first ones in (repository, number) order; 0: all).
    pub max_prs: usize,
    pub repeat: u32,
    pub work: PathBuf,
    /// PRs at once in the second pair of passes (1: one pair only).
    pub jobs: usize,
}

/// CPU seconds this machine has spent busy so far (every core: user, nice, system, irq,
/// softirq), from `/proc/stat`. The runs' own CPU cannot be read from `getrusage`: bubblewrap's
/// init in the run's pid namespace is never waited for by the process this one waits for, so
/// the runs' time never reaches `RUSAGE_CHILDREN` (it counted 0.002 s of a 1 s busy loop). On a
/// machine doing nothing else, the machine's busy time is the stage's.
fn machine_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return 0.0 };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return 0.0 };
    let f: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq: all but idle and iowait.
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy / hz
}

struct Pass {
    wall: f64,
    cpu: f64,
    notes: serde_json::Value,
}

impl Pass {
    fn n(&self, key: &str) -> f64 {
        self.notes[key].as_f64().unwrap_or(0.0)
    }
}

pub fn verify(o: &VerifyBenchOptions) -> Result<()> {
    let _ = std::fs::remove_dir_all(&o.work);
    let mut settings = vec![1];
    if o.jobs > 1 {
        settings.push(o.jobs);
    }
    let mut runs: Vec<(usize, Pass, Pass, PathBuf)> = Vec::new();
    for &jobs in &settings {
        let (cold, warm, lake) = passes(o, jobs)?;
        runs.push((jobs, cold, warm, lake));
    }
    let (_, first_cold, _, first_lake) = &runs[0];
    let prs = first_cold.n("prs_verified_now").max(1.0);
    println!("verify on {} ({} PRs, {} runs a side)\n", o.lake.display(), prs, o.repeat);
    println!("| jobs | pass | s per instance | environments built | reused | share reused | cores used |");
    println!("|---|---|---|---|---|---|---|");
    for (jobs, cold, warm, _) in &runs {
        for (name, p) in [("cold (environments built)", cold), ("warm (environments reused)", warm)] {
            let (b, r) = (p.n("environments_built"), p.n("environments_reused"));
            println!(
                "| {jobs} | {name} | {:.2} | {b:.0} | {r:.0} | {:.0}% | {:.2} |",
                p.wall / prs,
                100.0 * r / (b + r).max(1.0),
                p.cpu / p.wall.max(1e-9)
            );
        }
    }
    let (_, cold, warm, _) = &runs[0];
    println!("\nwarm / cold: {:.2}x the time per instance", warm.wall / cold.wall.max(1e-9));
    if let Some((jobs, cold_n, warm_n, lake_n)) = runs.get(1) {
        println!(
            "{jobs} jobs / 1 job: {:.2}x the time cold, {:.2}x warm",
            cold_n.wall / cold.wall.max(1e-9),
            warm_n.wall / warm.wall.max(1e-9)
        );
        let (a, b) =
            (verdicts(first_lake, &o.work.join("jobs-1"))?, verdicts(lake_n, &o.work.join(format!("jobs-{jobs}")))?);
        let same = a == b;
        println!(
            "pr_verification with {jobs} jobs and with 1 (durations aside): {} ({} rows)",
            if same { "identical" } else { "DIFFERENT" },
            a.len()
        );
    }
    println!("\n| status | PRs |\n|---|---|");
    if let Some(m) = cold.notes.as_object() {
        for (k, v) in m.iter().filter(|(k, _)| k.starts_with("status:")) {
            println!("| {} | {v} |", k.trim_start_matches("status:"));
        }
    }
    println!(
        "\nWhy the others failed: swelake sql --lake {} \"SELECT status, reason, count(*) FROM pr_verification \
         WHERE status <> 'verified' GROUP BY 1, 2 ORDER BY 3 DESC\"",
        first_lake.display()
    );
    Ok(())
}

/// `pr_verification` of a lake without the durations, as text rows in key order, with the
/// pass's own directory (in reasons and log tails) written as `WORK`.
fn verdicts(lake: &Path, work: &Path) -> Result<Vec<String>> {
    let lake = crate::lake::Lake::open(&lake.to_string_lossy())?;
    tokio::runtime::Handle::current().block_on(async {
        let ctx = lake.session().await?;
        let batches = ctx
            .sql(
                "SELECT repo_name, pr_number, status, reason, fail_to_pass, pass_to_pass, flaky, test_files, env_key, \
                 package_version, log_tail FROM pr_verification ORDER BY repo_name, pr_number",
            )
            .await?
            .collect()
            .await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        let work = work.to_string_lossy();
        Ok(text.lines().map(|l| l.replace(work.as_ref(), "WORK")).collect())
    })
}

/// A cold and a warm pass with `jobs` PRs at once, on a lake and a cache of their own.
fn passes(o: &VerifyBenchOptions, jobs: usize) -> Result<(Pass, Pass, PathBuf)> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let work = o.work.join(format!("jobs-{jobs}"));
    let lake = work.join("lake");
    jobs::link_dir(&o.lake, &lake)?;
    for t in [crate::verify::PR_VERIFICATION, crate::verify::PR_TESTS, crate::verify::ENVIRONMENTS] {
        let _ = std::fs::remove_dir_all(lake.join(t));
    }
    let config = work.join("verify.toml");
    let s = |p: &Path| p.to_string_lossy().into_owned();
    std::fs::write(
        &config,
        format!(
            "[verify]\ndir = {:?}\nmax_prs_per_run = {}\nrepeat = {}\njobs = {jobs}\n",
            s(&work.join("verify")),
            o.max_prs,
            o.repeat.max(1)
        ),
    )?;
    let pass = |force: bool| -> Result<Pass> {
        let mut args =
            vec!["-q", "run", "verify", "--json", "--lake", &s(&lake), "--repo-url", &o.repo_url, "--config"]
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>();
        args.extend([s(&config), "--cache-dir".into(), s(&o.cache_dir)]);
        if force {
            args.push("--force".into());
        }
        let (cpu0, t) = (machine_cpu(), Instant::now());
        let out = std::process::Command::new(&exe).args(&args).output().context("running swelake run verify")?;
        let (wall, cpu) = (t.elapsed().as_secs_f64(), machine_cpu() - cpu0);
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            anyhow::bail!("run verify failed: {}{}", text, String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default())
            .with_context(|| format!("run --json printed {text:?}"))?;
        let notes = v["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["job"] == "verify"))
            .map(|j| j["notes"].clone())
            .with_context(|| format!("no verify job in {v}"))?;
        Ok(Pass { wall, cpu, notes })
    };
    let cold = pass(false)?;
    let warm = pass(true)?;
    Ok((cold, warm, lake))
}
