//! Benchmarks (`swelake bench …`): each prints a figure next to a baseline measured on the same
//! machine in the same run, and the ratio. They are commands, never timed tests.
//!
//! One file per benchmark; `cluster` starts what they need on loopback (moto, Ballista); the
//! Python baselines are files under `bench/`; the generated archive days they run on come from
//! [`crate::synthetic`]. The trainer's benchmarks live in its crate (`swelake_train::bench`).
//! Here: the helpers every benchmark uses, to run a child process timed and measured.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

mod backfill;
mod blobs;
mod cluster;
mod grade;
mod ingest;
mod jobs;
mod lake;
mod project;
mod relevance;
mod reward;
mod verify;

pub use backfill::{backfill, BackfillBenchOptions};
pub use blobs::{blobs, BlobsBenchOptions};
pub use grade::{grade, GradeBenchOptions};
pub use ingest::{gunzip_pages, ingest, IngestBenchOptions};
pub use jobs::{jobs, JobsBenchOptions};
pub use lake::{lake, LakeBenchOptions};
pub use project::{project, ProjectBenchOptions, Scale};
pub use relevance::{relevance, RelevanceBenchOptions};
pub use reward::{reward, RewardBenchOptions};
pub use verify::{verify, VerifyBenchOptions};

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Runs a command pinned to CPU 0 if `pin` (`taskset` must exist); returns wall seconds, the
/// peak RSS of that child in MiB (from its own `wait4` usage, not the maximum over earlier
/// children) and its stdout.
fn timed_child(args: Vec<String>, pin: bool) -> Result<(f64, f64, String)> {
    timed_child_on(args, pin.then_some(1))
}

/// [`timed_child`] on the first `cpus` CPUs (`None`: wherever the system runs it). A process
/// pinned so sees only those CPUs as available parallelism (DataFusion's partitions, our
/// thread counts), as on a machine of that size.
fn timed_child_on(mut args: Vec<String>, cpus: Option<usize>) -> Result<(f64, f64, String)> {
    if let Some(n) = cpus {
        let list = if n <= 1 { "0".to_string() } else { format!("0-{}", n - 1) };
        args.splice(0..0, ["taskset".to_string(), "-c".to_string(), list]);
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
