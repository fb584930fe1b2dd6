//! `bench reward`: `swelake reward` on one thread and on all, against python3's difflib
//! running the same cases (`bench/reward_baseline.py`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{have, timed_child};
use anyhow::{bail, Context, Result};

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
