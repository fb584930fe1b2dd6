//! How a Rust PR's tests run: `cargo test` in the sandbox, offline, on the vendored sources,
//! once per test target the PR's test files are ([`super::plan`]), in the target directory of
//! the environment's graph (held by one run at a time: the second PR of a lock compiles only
//! what changed). Outcomes come from libtest's lines (`test parser::tests::empty ... ok`),
//! the target from cargo's `Running … (target/debug/deps/NAME-HASH)`; a target that does not
//! compile reports no test: on the merge base (the test uses what the fix adds) its tests are
//! absent, as pytest's uncollectable module; after the fix it is the environment's failure,
//! with the compiler's first error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::env::{cargo_env, mounts, RustTools};
use super::{plan, Invocation, Member};
use crate::verify::outcomes::{Outcome, TestResult};
use crate::verify::sandbox::{self, Mounts};
use crate::verify::toolchain::{lock_file, Missing, RunCtx, RunOutcome, Side, TestRunner};

/// `cargo test` in an environment.
#[derive(Debug, Clone)]
pub struct CargoTest {
    pub rust: RustTools,
    /// The environment: cargo's configuration of the vendored sources.
    pub env_dir: PathBuf,
    pub vendor: PathBuf,
    /// The graph's target directory, shared by its PRs.
    pub target: PathBuf,
    /// The `Cargo.lock` every tree of the environment runs with.
    pub lock: Arc<String>,
    pub members: Vec<Member>,
    /// Past this size (MiB) after a run, the target directory is emptied.
    pub target_mb: u64,
}

/// What one `cargo test` gave.
#[derive(Debug, PartialEq)]
enum Ran {
    Tests(Vec<TestResult>),
    /// It did not compile: the compiler's first error.
    NotCompiled(String),
}

impl TestRunner for CargoTest {
    fn name(&self) -> &'static str {
        "cargo test"
    }

    /// The environment's lock into the tree (the committed one, or the one resolved for it).
    fn before_runs(&self, ctx: &RunCtx<'_>) -> std::result::Result<(), String> {
        let lock = ctx.tree.join("Cargo.lock");
        // A link the tree committed as Cargo.lock must not carry the write elsewhere.
        if std::fs::symlink_metadata(&lock).is_ok() {
            std::fs::remove_file(&lock).map_err(|e| format!("replacing Cargo.lock: {e}"))?;
        }
        std::fs::write(&lock, self.lock.as_bytes()).map_err(|e| format!("writing Cargo.lock: {e}"))?;
        std::fs::create_dir_all(ctx.side_dir.join("cargo-home")).map_err(|e| format!("{e}"))
    }

    fn run(&self, ctx: &RunCtx<'_>, files: &[String]) -> Result<RunOutcome> {
        let out = ctx.side_dir.join("out");
        std::fs::create_dir_all(&out)?;
        let tree = ctx.tree;
        let list = |dir: &str| -> Vec<String> {
            let Ok(entries) = std::fs::read_dir(tree.join(dir)) else { return Vec::new() };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        format!("{name}/")
                    } else {
                        name
                    }
                })
                .collect();
            names.sort();
            names
        };
        let invocations: Vec<Option<Invocation>> = if ctx.cfg.whole_suite || files.is_empty() {
            vec![None]
        } else {
            plan(files, &self.members, &list).into_iter().map(Some).collect()
        };
        // One writer of the target directory at a time.
        let _guard = lock_file(&self.target.with_extension("lock"))?;
        fresh_sources(tree, &self.target)?;
        let started = Instant::now();
        let limit = Duration::from_secs(ctx.cfg.timeout_secs);
        let mut tests: Vec<TestResult> = Vec::new();
        let mut compiled = 0;
        let mut first_error: Option<String> = None;
        let mut tail = String::new();
        // Every invocation's log in one, where `evaluate` keeps a run's output.
        let mut whole = String::new();
        for (k, inv) in invocations.iter().enumerate() {
            let mut argv = vec![
                self.rust.cargo.to_string_lossy().to_string(),
                "test".into(),
                "--offline".into(),
                "--config".into(),
                self.env_dir.join("config.toml").to_string_lossy().to_string(),
                "--no-fail-fast".into(),
            ];
            match inv {
                Some(inv) => {
                    // The package by its manifest, not `-p NAME`: a crate that is also a
                    // dependency of its own dev-dependencies (bytes, through one of tokio's) makes
                    // the name ambiguous.
                    let dir = self.members.iter().find(|m| m.name == inv.package).map(|m| m.dir.as_str()).unwrap_or("");
                    let manifest =
                        if dir.is_empty() { tree.join("Cargo.toml") } else { tree.join(dir).join("Cargo.toml") };
                    argv.extend(["--manifest-path".into(), manifest.to_string_lossy().to_string()]);
                    argv.extend(inv.target.flags());
                    argv.push("--".into());
                    argv.extend(inv.filters.iter().cloned());
                }
                None => argv.extend(["--workspace".into(), "--tests".into()]),
            }
            let log = out.join(format!("{}-{k}.log", ctx.label));
            let Some(left) = limit.checked_sub(started.elapsed()) else {
                return Ok(RunOutcome::TimedOut(tail));
            };
            let m = Mounts {
                read_only: mounts(&self.rust, &self.env_dir, &self.vendor),
                writable: vec![ctx.side_dir.to_path_buf()],
                kept: vec![self.target.clone()],
            };
            let env = cargo_env(&self.rust, &ctx.side_dir.join("cargo-home"), &self.target);
            let exit = ctx.sandbox.run(&argv, tree, &env, &m, &log, left)?;
            tail = crate::verify::runner::without_durations(&sandbox::tail(&log, 15));
            if exit.timed_out {
                return Ok(RunOutcome::TimedOut(tail));
            }
            // The log is the run's own file: read without following a link it may have left.
            let text = sandbox::read_output(&log, ctx.side_dir, 64 << 20).context("reading cargo's log")?;
            whole.push_str(&text);
            let fallback = inv.as_ref().map(|i| i.target.name().to_string()).unwrap_or_default();
            match parse(&text, &fallback) {
                Ran::Tests(t) => {
                    compiled += 1;
                    tests.extend(t);
                }
                Ran::NotCompiled(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        sandbox::write_output(&out.join(format!("{}.log", ctx.label)), ctx.side_dir, whole.as_bytes())?;
        self.bound_target();
        match first_error {
            Some(e) if compiled == 0 => Ok(RunOutcome::NoReport(Some(101), e)),
            _ => Ok(RunOutcome::Report(tests, tail)),
        }
    }

    fn missing_report(&self, side: Side, _code: Option<i32>) -> Missing {
        match side {
            Side::Before => Missing::Absent,
            Side::After => Missing::Failed,
        }
    }

    /// The compiler's first error, else the last line.
    fn error_line(&self, tail: &str) -> String {
        let lines: Vec<&str> = tail.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        lines.iter().find(|l| l.starts_with("error")).or(lines.last()).map(|l| l.to_string()).unwrap_or_default()
    }
}

impl CargoTest {
    /// Empties the target directory when it has grown past its bound (each PR's tree is a
    /// package of its own path to cargo: its artifacts stay beside the shared dependencies').
    fn bound_target(&self) {
        let bytes = dir_size(&self.target);
        if bytes > self.target_mb << 20 {
            eprintln!(
                "verify: target directory {} holds {} MiB, past [verify] rust_target_mb = {}: emptied",
                self.target.display(),
                bytes >> 20,
                self.target_mb
            );
            let _ = std::fs::remove_dir_all(&self.target);
        }
    }
}

/// Makes cargo see `tree`'s sources as newer than what the target holds. Cargo names a
/// package's artifacts by its path relative to the workspace, not by where the tree is, so
/// every PR's tree builds the same files, and it trusts them while the sources are older: a
/// tree written before another PR's build (its worker waited for the target's lock) would run
/// that PR's test binary. So when the target was last built from another tree, every file of
/// this one gets the current time first; a tree's repeated runs reuse their own build.
fn fresh_sources(tree: &Path, target: &Path) -> Result<()> {
    let marker = target.with_extension("tree");
    let this = tree.to_string_lossy().to_string();
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(this.as_str()) {
        return Ok(());
    }
    let now = std::time::SystemTime::now();
    touch_all(tree, now).with_context(|| format!("marking {} newer than the target", tree.display()))?;
    std::fs::write(&marker, &this)?;
    Ok(())
}

fn touch_all(dir: &Path, when: std::time::SystemTime) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let kind = e.file_type()?;
        if kind.is_dir() {
            if e.file_name() != ".git" {
                touch_all(&e.path(), when)?;
            }
        } else if kind.is_file() {
            // Not through a link the tree may hold: O_NOFOLLOW.
            let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(e.path())?;
            f.set_modified(when)?;
        }
    }
    Ok(())
}

/// Bytes under `dir`, links not followed.
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.path().symlink_metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The tests of one `cargo test`'s log, named `target::path::name`, or the compiler's first
/// error when no test binary ran.
fn parse(log: &str, fallback_target: &str) -> Ran {
    let running = regex::Regex::new(r"^\s*Running .*\((?:.*[/\\])?deps[/\\]([^/\\()]+?)-[0-9a-f]+(?:\.exe)?\)\s*$")
        .expect("a valid pattern");
    let line = regex::Regex::new(r"^test (.+?) \.\.\. (ok|FAILED|ignored)\b").expect("a valid pattern");
    let mut target = fallback_target.to_string();
    let mut ran = false;
    let mut tests: Vec<TestResult> = Vec::new();
    for l in log.lines() {
        if let Some(c) = running.captures(l) {
            target = c[1].to_string();
            continue;
        }
        if l.starts_with("running ") && l.ends_with(" test") || l.starts_with("running ") && l.ends_with(" tests") {
            ran = true;
            continue;
        }
        if let Some(c) = line.captures(l) {
            let name = c[1].trim_end_matches(" - should panic").to_string();
            let outcome = match &c[2] {
                "ok" => Outcome::Passed,
                "ignored" => Outcome::Skipped,
                _ => Outcome::Failed,
            };
            let id = format!("{target}::{name}");
            match tests.iter_mut().find(|t| t.test_id == id) {
                Some(t) => t.outcome = t.outcome.max(outcome),
                None => tests.push(TestResult { test_id: id, outcome, seconds: 0.0 }),
            }
        }
    }
    if ran {
        return Ran::Tests(tests);
    }
    let error = log
        .lines()
        .position(|l| l.starts_with("error"))
        .map(|i| {
            let at = log.lines().skip(i + 1).take(3).find_map(|l| l.trim().strip_prefix("--> ")).unwrap_or("");
            let first = log.lines().nth(i).unwrap_or("").trim();
            if at.is_empty() {
                first.to_string()
            } else {
                format!("{first} ({at})")
            }
        })
        .unwrap_or_else(|| {
            log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("cargo test ran no test").to_string()
        });
    Ran::NotCompiled(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_lines_per_target_and_the_first_compile_error() {
        let log = "   Compiling calc v0.3.0 (/w/before/tree)\n    Finished `test` profile [unoptimized + debuginfo] target(s) in 1.02s\n\
                   \x20    Running unittests src/lib.rs (/v/rust/target/ab12/debug/deps/calc-0f3c2a1b9d8e7f65)\n\n\
                   running 2 tests\ntest parser::tests::empty ... ok\ntest parser::tests::slow ... ignored, needs a network\n\n\
                   test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 3 filtered out; finished in 0.00s\n\n\
                   \x20    Running tests/parse.rs (/v/rust/target/ab12/debug/deps/parse-9a8b7c6d5e4f3a2b)\n\n\
                   running 2 tests\ntest negative_numbers ... FAILED\ntest overflow - should panic ... ok\n\n\
                   failures:\n\n---- negative_numbers stdout ----\nthread 'negative_numbers' panicked\n";
        let Ran::Tests(t) = parse(log, "calc") else { panic!("tests ran") };
        let got: Vec<(&str, Outcome)> = t.iter().map(|t| (t.test_id.as_str(), t.outcome)).collect();
        assert_eq!(
            got,
            [
                ("calc::parser::tests::empty", Outcome::Passed),
                ("calc::parser::tests::slow", Outcome::Skipped),
                ("parse::negative_numbers", Outcome::Failed),
                ("parse::overflow", Outcome::Passed),
            ]
        );
        let broken = "   Compiling calc v0.3.0 (/w/before/tree)\nerror[E0425]: cannot find function `parse_signed` in crate `calc`\n \
                      --> tests/parse.rs:9:22\n  |\n9 |     assert_eq!(calc::parse_signed(\"-1\"), Some(-1));\n\n\
                      error: could not compile `calc` (test \"parse\") due to 1 previous error\n";
        assert_eq!(
            parse(broken, "parse"),
            Ran::NotCompiled(
                "error[E0425]: cannot find function `parse_signed` in crate `calc` (tests/parse.rs:9:22)".into()
            )
        );
        // A filter that matches nothing ran: no test, not a failure.
        assert_eq!(parse("running 0 tests\n\ntest result: ok. 0 passed\n", "calc"), Ran::Tests(vec![]));
    }
}
