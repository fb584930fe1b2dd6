//! What a language is to the verify stage: a [`Toolchain`] claims a tree by its project files,
//! knows which of a PR's test files its runner takes, and prepares an environment as of the
//! PR's day whose [`TestRunner`] runs a side's tests in the sandbox and says what a run that
//! wrote no report means. DataFusion's `FileFormatFactory`/`FileFormat` pair is the shape: the
//! stage holds a table of toolchains ([`super::TOOLCHAINS`]) and asks them; nothing outside a
//! language's module branches on its name.
//!
//! This module knows no language: the shared parts (the environment row, the per-run tools
//! each toolchain keeps in [`Tools`], the statuses) live here so the languages depend on it and
//! it on none of them.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::Serialize;

use super::outcomes::TestResult;
use super::sandbox::Sandbox;
use super::{PrRef, VerifyConfig};

/// A language's toolchain.
pub trait Toolchain: Send + Sync + 'static {
    /// Its name: `environments.language` of its trees (JavaScript's may say `typescript`), the
    /// reason texts.
    fn name(&self) -> &'static str;

    /// The files at a tree's root that make it a project of this language.
    fn project_files(&self) -> &'static [&'static str];

    /// Whether a changed test path is a file its runner can be pointed at
    /// ([`crate::testfiles`]).
    fn is_test_file(&self, path: &str) -> bool {
        crate::testfiles::runnable(self.name(), path)
    }

    /// What its runnable test files look like, for the reason of a PR that has none.
    fn test_file_kinds(&self) -> &'static str;

    /// The environment the PR's tests run in, as of its merge date, for the tree whose files
    /// `read` gives (the merge base; a path ending in `/` gives that directory's entries, one a
    /// line, subdirectories ending in `/`): built, or taken from the cache. `Err`: why not.
    fn prepare(
        &self,
        read: &dyn Fn(&str) -> Option<String>,
        pr: &PrRef,
        tools: &Tools,
        sandbox: &Sandbox,
    ) -> std::result::Result<Prepared, EnvStop>;
}

/// An environment and the project's version as its tree states it.
pub struct Prepared {
    pub env: Env,
    pub version: String,
}

/// What one run of a side needs.
pub struct RunCtx<'a> {
    /// The scratch tree the tests run in.
    pub tree: &'a Path,
    /// The side's directory (the tree and `out/`): the only writable place of the run.
    pub side_dir: &'a Path,
    /// `before-1`, `after-3`, `eval`: names the run's report and log.
    pub label: &'a str,
    pub tools: &'a Tools,
    pub sandbox: &'a Sandbox,
    pub cfg: &'a VerifyConfig,
}

/// Which side of a PR a run is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The merge base with the PR's test changes.
    Before,
    /// With all its changes (or, under `evaluate`, a model's patch).
    After,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Before => "before",
            Side::After => "after",
        }
    }
}

/// How an environment's tests run; made by its toolchain's `prepare`.
pub trait TestRunner: Send + Sync + std::fmt::Debug {
    /// The runner's name (`pytest`, `mocha`, `node --test`).
    fn name(&self) -> &'static str;

    /// Work a side's tree needs once before its runs (a `test` script's build step), in the
    /// sandbox. `Err`: why the side cannot run.
    fn before_runs(&self, _ctx: &RunCtx<'_>) -> Result<(), String> {
        Ok(())
    }

    /// Runs `files` (the whole suite when `cfg.whole_suite` or empty) in the sandbox.
    fn run(&self, ctx: &RunCtx<'_>, files: &[String]) -> Result<RunOutcome>;

    /// What a run on `side` that wrote no report, with exit status `code`, means.
    fn missing_report(&self, side: Side, code: Option<i32>) -> Missing;

    /// The line of a run's log that says what went wrong.
    fn error_line(&self, tail: &str) -> String {
        tail.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string()
    }
}

/// How one run of a runner ended.
pub enum RunOutcome {
    /// Its per-test report, and the log's last lines.
    Report(Vec<TestResult>, String),
    TimedOut(String),
    /// No report: the exit status and the log's last lines.
    NoReport(Option<i32>, String),
}

/// What a run without a report means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The test files did not load (they require what the fix adds): their tests are absent
    /// on this side, as pytest reports a module it cannot collect.
    Absent,
    /// The runner collected no test.
    NoTests,
    /// The runner failed: the environment's fault.
    Failed,
}

/// Every status a PR can get, in the order the card lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Verified,
    NoFailToPass,
    Flaky,
    EnvFailed,
    TestsNotFound,
    PatchFailed,
    Timeout,
    ToolchainUnavailable,
    NoTestChange,
}

impl Status {
    pub const ALL: [Status; 9] = [
        Status::Verified,
        Status::NoFailToPass,
        Status::Flaky,
        Status::EnvFailed,
        Status::TestsNotFound,
        Status::PatchFailed,
        Status::Timeout,
        Status::ToolchainUnavailable,
        Status::NoTestChange,
    ];

    /// Its name in `pr_verification.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Verified => "verified",
            Status::NoFailToPass => "no_fail_to_pass",
            Status::Flaky => "flaky",
            Status::EnvFailed => "env_failed",
            Status::TestsNotFound => "tests_not_found",
            Status::PatchFailed => "patch_failed",
            Status::Timeout => "timeout",
            Status::ToolchainUnavailable => "toolchain_unavailable",
            Status::NoTestChange => "no_test_change",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a PR's environment could not be had.
pub struct EnvStop {
    pub status: Status,
    pub reason: String,
    /// The environment's row, when one was tried.
    pub row: Option<Box<EnvRow>>,
    /// The project's version as the tree states it.
    pub version: String,
}

impl EnvStop {
    /// A stop before any environment was tried.
    pub fn new(status: Status, reason: impl Into<String>, version: &Option<String>) -> EnvStop {
        EnvStop { status, reason: reason.into(), row: None, version: version.clone().unwrap_or_default() }
    }

    /// An environment that was tried and failed (`env_failed`, with its row).
    pub fn failed(row: Box<EnvRow>, as_of: &str, version: Option<String>) -> EnvStop {
        EnvStop {
            status: Status::EnvFailed,
            reason: format!("environment as of {as_of}: {}", row.reason),
            row: Some(row),
            version: version.unwrap_or_default(),
        }
    }
}

/// A row of `environments`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EnvRow {
    pub repo_name: String,
    pub env_key: String,
    pub language: String,
    pub interpreter: String,
    pub spec_files: Vec<String>,
    pub requirements: Vec<String>,
    pub packages: Vec<String>,
    pub relaxed: Vec<String>,
    pub resolved_as_of: String,
    pub status: String,
    pub reason: String,
    pub seconds: f64,
}

impl EnvRow {
    /// The row of an environment not (yet) built: status `failed` until it is.
    pub fn new(
        repo: &str,
        language: &str,
        interpreter: String,
        spec_files: &[String],
        requirements: Vec<String>,
        as_of: &str,
    ) -> EnvRow {
        EnvRow {
            repo_name: repo.to_string(),
            env_key: String::new(),
            language: language.to_string(),
            interpreter,
            spec_files: spec_files.to_vec(),
            requirements,
            packages: Vec::new(),
            relaxed: Vec::new(),
            resolved_as_of: as_of.to_string(),
            status: "failed".into(),
            reason: String::new(),
            seconds: 0.0,
        }
    }

    /// The row as the answer of an environment that could not be had.
    pub fn failed<T>(mut self, reason: &str) -> std::result::Result<T, Box<EnvRow>> {
        self.reason = one_line(reason);
        self.seconds = 0.0;
        Err(Box::new(self))
    }
}

/// An environment ready to run tests in.
#[derive(Debug, Clone)]
pub struct Env {
    pub key: String,
    /// The virtual environment, or the directory holding `node_modules`.
    pub dir: PathBuf,
    pub row: EnvRow,
    pub runner: Arc<dyn TestRunner>,
}

/// What every toolchain shares in a run: the configuration, the directory of locks,
/// environments and scratch trees, and each toolchain's own tools (interpreters, uv, node),
/// found the first time a tree of its language asks — a lake of JavaScript repositories never
/// asks PyPI for uv.
#[derive(Clone)]
pub struct Tools {
    /// `[verify] dir`, else `<cache>/.verify`.
    pub root: PathBuf,
    pub cfg: VerifyConfig,
    kits: Arc<Mutex<BTreeMap<&'static str, Arc<dyn Any + Send + Sync>>>>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tools").field("root", &self.root).finish_non_exhaustive()
    }
}

impl Tools {
    /// The run's tools under `[verify] dir` (else `cache/.verify`); no toolchain probed yet.
    pub fn prepare(cfg: &VerifyConfig, cache: &Path) -> Result<Tools> {
        let root = if cfg.dir.is_empty() { cache.join(".verify") } else { PathBuf::from(&cfg.dir) };
        // Runs name their environments and trees from other working directories.
        let root = std::path::absolute(&root).with_context(|| format!("resolving {}", root.display()))?;
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        Ok(Tools { root, cfg: cfg.clone(), kits: Arc::default() })
    }

    /// The toolchain `name`'s tools of this run, made by `init` on the first call.
    pub fn kit<T: Any + Send + Sync>(&self, name: &'static str, init: impl FnOnce(&Tools) -> T) -> Arc<T> {
        let mut kits = self.kits.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kits.get(name).and_then(|k| Arc::clone(k).downcast::<T>().ok()) {
            return k;
        }
        let k = Arc::new(init(self));
        kits.insert(name, k.clone());
        k
    }
}

/// 16 hex digits of FNV-1a: a cache key.
pub fn key_of(text: &str) -> String {
    format!("{:016x}", crate::hash::fnv1a_str(text))
}

/// A reason as one line of at most 400 characters (a table cell, not a log).
pub fn one_line(s: &str) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > 400 {
        format!("{}…", s.chars().take(400).collect::<String>())
    } else {
        s
    }
}

/// An environment directory made once for every toolchain alike: under a lock on its key (one
/// builder across the workers of a run and across runs), unless its ready marker is there,
/// `dir` is emptied, `build` fills it, and `probe` checks in the sandbox that its runner
/// starts; only then is the marker written, without following a link the build may have left.
/// Answers whether it was built now.
pub fn build_once(dir: &Path, build: impl FnOnce() -> Result<()>, probe: impl FnOnce() -> Result<()>) -> Result<bool> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let _lock = lock_file(&dir.with_file_name(format!("{name}.lock")))?;
    let ready = dir.join(".swelake-ready");
    if ready.is_file() {
        return Ok(false);
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let built = build().and_then(|()| probe());
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(dir);
        return Err(e);
    }
    super::sandbox::write_output(&ready, dir, b"")?;
    Ok(true)
}

/// An exclusive lock on `path` (made when absent) while the guard lives: two workers of one
/// run, or two runs, never build the same environment at once.
pub fn lock_file(path: &Path) -> Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; released when the file closes.
    let rc = unsafe { libc::flock(std::os::unix::io::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", path.display()));
    }
    Ok(f)
}
