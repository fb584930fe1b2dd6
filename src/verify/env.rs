//! Python environments as of a PR's day, without Docker: what the tree at the merge base
//! declares ([`super::spec`]) resolved by `uv` against the registries as they were on the PR's merge date
//! (`--exclude-newer`), installed into a virtual environment cached by the resolved lock's
//! hash, so PRs with the same lock share one.
//!
//! The project itself is not installed: its tree goes on `PYTHONPATH` (`src/` when it has a
//! package there), so building the environment runs none of its code (no `setup.py`), and one
//! environment serves every PR with the same dependencies. Only registry packages are
//! installed, by uv — in the sandbox ([`Sandbox::run_with`], as its build uid): resolving and
//! installing may build a release's sdist, and that runs the package's own `setup.py`. Such a
//! build reaches the network (the registry) but sees no home, no host environment variable,
//! nothing of the host's files but the system directories, and writes only uv's cache, the
//! environment being built and a scratch directory.
//!
//! When the test tooling of the PR's day does not start on this interpreter (pytest of 2021
//! with `py` on Python 3.11), the tooling alone (pytest, its plugins and helpers) floats to
//! the releases of the interpreter's first months while the project's own dependencies stay
//! as of the PR's day; the environment records which pins were relaxed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::sandbox::{read_output, write_output, Mounts, RunOptions, Sandbox};
use super::spec::{is_tooling, normalize, requirement_name, Spec};
use super::VerifyConfig;

/// uv and the interpreter, found or fetched once per run.
#[derive(Debug, Clone)]
pub struct Tools {
    /// uv, fetched the first time a Python environment needs it (a lake of JavaScript
    /// repositories never asks PyPI for it); `Err`: why it could not be had.
    uv: std::sync::OnceLock<std::result::Result<PathBuf, String>>,
    uv_version: String,
    /// The interpreter's own executable (not a shim).
    pub python: PathBuf,
    /// `3.11.7`.
    pub python_version: String,
    /// `sys.base_prefix`: mounted read-only into the sandbox.
    pub python_prefix: PathBuf,
    /// Why there is no interpreter (`[verify] python` does not run): Python trees are then
    /// `toolchain_unavailable`, the others still verify.
    pub python_missing: Option<String>,
    /// `[verify] dir`, else `<cache>/.verify`: locks, environments, scratch trees.
    pub root: PathBuf,
    /// Node and npm, for JavaScript and TypeScript trees, or why there are none.
    pub node: std::result::Result<super::node::NodeTools, String>,
}

impl Tools {
    /// Finds the interpreter and node; uv comes when first needed (a pinned uv from PyPI into
    /// `cache/.verify/tools` when `uv_version` is set, else the one on PATH).
    pub fn prepare(cfg: &VerifyConfig, cache: &Path) -> Result<Tools> {
        let root = if cfg.dir.is_empty() { cache.join(".verify") } else { PathBuf::from(&cfg.dir) };
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let (python, python_missing) = match probe_python(&cfg.python) {
            Ok(p) => (p, None),
            Err(why) => (["", "", ""].map(String::from), Some(why)),
        };
        let [exe, version, prefix] = python;
        Ok(Tools {
            uv: std::sync::OnceLock::new(),
            uv_version: cfg.uv_version.clone(),
            python: PathBuf::from(exe),
            python_version: version,
            python_prefix: PathBuf::from(prefix),
            python_missing,
            root,
            node: super::node::NodeTools::probe(),
        })
    }

    /// uv, fetched on the first call; `Err`: why there is none.
    pub fn uv_path(&self) -> std::result::Result<PathBuf, String> {
        self.uv
            .get_or_init(|| {
                let python = self.python.to_string_lossy();
                fetch_uv(&self.uv_version, &self.root, &python).map_err(|e| format!("{e:#}"))
            })
            .clone()
    }

    /// The interpreter's prefix to mount read-only into a sandbox (none without one).
    pub fn python_mounts(&self) -> Vec<PathBuf> {
        if self.python_missing.is_some() {
            Vec::new()
        } else {
            vec![self.python_prefix.clone()]
        }
    }

    /// `major.minor` of the interpreter.
    pub fn python_minor(&self) -> String {
        self.python_version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".")
    }

    /// Runs uv with `args` in the sandbox as its build uid, with the network: the interpreter
    /// and uv read-only, `writable` and uv's cache writable, `HOME` a scratch directory of its
    /// own, no credentials of the lake or of the user (only the registry's address, a
    /// certificate file and a proxy, when set). Answers uv's output (both streams) when it
    /// succeeds, else an error holding it.
    fn uv(&self, sandbox: &Sandbox, args: &[String], writable: &[PathBuf]) -> Result<String> {
        let uv = self.uv_path().map_err(anyhow::Error::msg)?;
        let tmp = self.root.join("tmp");
        std::fs::create_dir_all(&tmp)?;
        let scratch = tempfile::Builder::new().prefix("uv-").tempdir_in(&tmp)?;
        let home = scratch.path().join("home");
        std::fs::create_dir_all(&home)?;
        let cache = self.root.join("uv-cache");
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), home.to_string_lossy().into()),
            ("UV_CACHE_DIR".into(), cache.to_string_lossy().into()),
            ("UV_PYTHON_DOWNLOADS".into(), "never".into()),
            ("UV_NO_CONFIG".into(), "1".into()),
            ("UV_NO_PROGRESS".into(), "1".into()),
            // The cache and the environment are two mounts in the sandbox, and a hard link
            // cannot cross mounts: uv copies (it would fall back to that with a warning).
            ("UV_LINK_MODE".into(), "copy".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        let mut read_only = vec![uv.clone()];
        read_only.extend(self.python_mounts());
        for k in [
            "UV_INDEX_URL",
            "UV_DEFAULT_INDEX",
            "PIP_INDEX_URL",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "HTTPS_PROXY",
            "https_proxy",
        ] {
            if let Ok(v) = std::env::var(k) {
                if k.starts_with("SSL_CERT") && Path::new(&v).exists() && !v.starts_with("/etc/ssl/certs") {
                    read_only.push(PathBuf::from(&v));
                }
                env.push((k.into(), v));
            }
        }
        let mut w = vec![scratch.path().to_path_buf()];
        w.extend(writable.iter().cloned());
        let mounts = Mounts { read_only, writable: w, kept: vec![cache] };
        let log = scratch.path().join("uv.log");
        let argv: Vec<String> = std::iter::once(uv.to_string_lossy().to_string()).chain(args.iter().cloned()).collect();
        let opts = RunOptions { network: true, build: true };
        let exit =
            sandbox.run_with(&argv, scratch.path(), &env, &mounts, &log, Duration::from_secs(UV_TIMEOUT), opts)?;
        let text = read_output(&log, scratch.path(), 16 << 20).unwrap_or_default();
        if exit.timed_out {
            bail!("uv {} passed {UV_TIMEOUT} s", args.first().map(String::as_str).unwrap_or(""));
        }
        if exit.code != Some(0) {
            bail!("{text}");
        }
        Ok(text)
    }
}

/// How long one call of uv (a resolution, an install with its builds) may take.
const UV_TIMEOUT: u64 = 1800;

/// The interpreter's executable, version and base prefix, or why it does not say.
fn probe_python(python: &str) -> std::result::Result<[String; 3], String> {
    let probe = Command::new(python)
        .args([
            "-c",
            "import sys, platform; print(sys.executable); print(platform.python_version()); print(sys.base_prefix)",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("the interpreter `{python}` does not run ([verify] python): {e}"))?;
    let text = String::from_utf8_lossy(&probe.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    if !probe.status.success() || lines.len() < 3 {
        return Err(format!(
            "`{python}` did not say what it is ([verify] python): {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok([lines[0].to_string(), lines[1].to_string(), lines[2].to_string()])
}

/// uv: the pinned release from PyPI, installed once into the cache with pip (as the ONNX
/// Runtime is fetched); `""` takes `uv` from PATH.
fn fetch_uv(version: &str, root: &Path, python: &str) -> Result<PathBuf> {
    if version.is_empty() {
        return super::sandbox::which("uv")
            .context("toolchain_unavailable: no `uv` on PATH ([verify] uv_version = \"\")");
    }
    let dir = root.join("tools").join(format!("uv-{version}"));
    let bin = dir.join("bin").join("uv");
    if bin.is_file() {
        return Ok(bin);
    }
    let staging = root.join("tools").join(format!(".uv-{version}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    eprintln!("fetching uv {version} from PyPI into {}", dir.display());
    let out = Command::new(python)
        // A wheel only: installing it runs no code of the package on the host.
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary", ":all:"])
        .arg("--target")
        .arg(&staging)
        .arg(format!("uv=={version}"))
        .stdin(Stdio::null())
        .output()
        .context("toolchain_unavailable: running pip to fetch uv")?;
    if !out.status.success() || !staging.join("bin").join("uv").is_file() {
        bail!(
            "toolchain_unavailable: could not fetch uv {version} from PyPI: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staging, &dir)?;
    Ok(bin)
}

/// Build backends: what builds a source distribution, floated to the interpreter's months.
const BUILD_BACKENDS: &[&str] =
    &["setuptools", "wheel", "flit-core", "hatchling", "poetry-core", "setuptools-scm", "pdm-backend", "cython"];

/// When each Python minor was released: tooling relaxed for it resolves as of two months
/// later (its first releases that support it).
fn interpreter_floor(minor: &str) -> Option<&'static str> {
    Some(match minor {
        "3.8" => "2019-12-14T00:00:00Z",
        "3.9" => "2020-12-05T00:00:00Z",
        "3.10" => "2021-12-04T00:00:00Z",
        "3.11" => "2022-12-24T00:00:00Z",
        "3.12" => "2023-12-02T00:00:00Z",
        "3.13" => "2024-12-07T00:00:00Z",
        "3.14" => "2025-12-07T00:00:00Z",
        _ => return None,
    })
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
    pub venv: PathBuf,
    pub row: EnvRow,
    /// How a JavaScript or TypeScript PR's tests run (`None`: pytest).
    pub node: Option<super::node::NodeRun>,
}

/// The environment of `spec` as of `as_of`, built or taken from the cache; `Err(row)` says
/// why it could not be (the row has status `failed`).
///
/// Packages float from the PR's day to the interpreter's first months (or the PR's day, if
/// later) only where the interpreter leaves no choice, each recorded in `relaxed`: build
/// backends always (the setuptools of 2017 cannot build on Python 3.11, and uv asks for
/// setuptools>=40.8.0 to build an sdist without a pyproject.toml); a package whose release of
/// the PR's day does not build here (greenlet 0.4 on 3.11: no wheel, C that no longer
/// compiles); and, when pytest of the PR's day does not resolve or start here, the test
/// tooling with everything it needs. Every other package stays as of the PR's day.
pub fn prepare(
    repo: &str,
    spec: &Spec,
    as_of: &str,
    tools: &Tools,
    sandbox: &Sandbox,
    relax_tooling: bool,
) -> std::result::Result<Env, Box<EnvRow>> {
    let started = Instant::now();
    let python = format!("python {}", tools.python_version);
    let mut row = EnvRow::new(repo, "python", python, &spec.files, spec.requirements(false), as_of);
    row.env_key = key_of(&format!("inputs\n{}\n{as_of}\n{}", tools.python_version, row.requirements.join("\n")));
    let floor = interpreter_floor(&tools.python_minor()).unwrap_or(as_of);
    let floor = if as_of > floor { as_of } else { floor };
    let mut floated: BTreeSet<String> = BUILD_BACKENDS.iter().map(|s| s.to_string()).collect();
    let relaxable = relax_tooling && row.requirements.iter().any(|r| is_tooling(&requirement_name(r)));
    let mut tooling_relaxed = false;
    let mut first_lock: Option<Vec<String>> = None;
    let mut errors: Vec<String> = Vec::new();
    // Each failure may float one more thing; a few rounds settle every case seen.
    for _ in 0..10 {
        let per_package: Vec<String> = floated.iter().map(|n| format!("{n}={floor}")).collect();
        let attempt = resolve(tools, sandbox, &row.requirements, as_of, &per_package)
            .map(|lock| (install(tools, &lock, sandbox).map_err(|e| (e, lock.clone())), lock));
        let err = match attempt {
            Ok((Ok((key, venv, fresh)), lock)) => {
                row.relaxed = relaxed_pins(first_lock.as_deref().unwrap_or(&[]), &lock, &floated);
                row.packages = lock;
                row.env_key = key.clone();
                row.status = "ready".into();
                row.seconds = if fresh { started.elapsed().as_secs_f64() } else { 0.0 };
                return Ok(Env { key, venv, row, node: None });
            }
            Ok((Err((e, lock)), _)) => {
                first_lock.get_or_insert(lock);
                e
            }
            Err(e) => e,
        };
        let text = format!("{err:#}");
        errors.push(text.clone());
        if let Some(pkg) = failed_build(&text).filter(|p| !floated.contains(p)) {
            floated.insert(pkg);
            continue;
        }
        if relaxable && !tooling_relaxed {
            tooling_relaxed = true;
            let reqs = spec.requirements(true);
            let mut tooling: Vec<String> = reqs.iter().filter(|r| is_tooling(&requirement_name(r))).cloned().collect();
            if !tooling.iter().any(|r| requirement_name(r) == "pytest") {
                tooling.push("pytest".into());
            }
            // The tooling's closure as of the floor: resolved alone, then floated together.
            let builders: Vec<String> = BUILD_BACKENDS.iter().map(|n| format!("{n}={floor}")).collect();
            match resolve(tools, sandbox, &tooling, floor, &builders) {
                Ok(closure) => floated.extend(closure.iter().map(|p| requirement_name(p))),
                Err(e) => errors.push(format!("the test tooling alone as of {floor}: {e:#}")),
            }
            row.requirements = reqs;
            continue;
        }
        break;
    }
    let last = errors.last().cloned().unwrap_or_default();
    let why = if errors.len() > 1 {
        format!("{last} (after {} attempts, floating {})", errors.len(), floated_names(&floated))
    } else {
        last
    };
    row.failed(&why)
}

/// The floated packages that are not build backends, for a reason.
fn floated_names(floated: &BTreeSet<String>) -> String {
    let v: Vec<&str> = floated.iter().map(String::as_str).filter(|n| !BUILD_BACKENDS.contains(n)).collect();
    if v.is_empty() {
        "the build backends".into()
    } else {
        v.join(", ")
    }
}

/// What moved from the PR's day: each floated package of `lock` with its version in the lock
/// of the PR's day (`first`, when one was resolved).
fn relaxed_pins(first: &[String], lock: &[String], floated: &BTreeSet<String>) -> Vec<String> {
    lock.iter()
        .filter(|p| floated.contains(&requirement_name(p)) && !first.contains(p))
        .map(|p| match first.iter().find(|o| requirement_name(o) == requirement_name(p)) {
            Some(o) => format!("{o} -> {p}"),
            None => format!("{} -> {p}", requirement_name(p)),
        })
        .collect()
}

/// The package uv could not build (``Failed to build `greenlet==0.4.15` ``), by its normal name.
fn failed_build(text: &str) -> Option<String> {
    let re = regex::Regex::new(r"Failed to (?:build|download and build) `([A-Za-z0-9._-]+?)(?:==[^`]*)?`")
        .expect("a valid pattern");
    re.captures(text).map(|c| normalize(&c[1]))
}

/// `name==version` lines resolved by uv for `requirements` as of `as_of`, cached on disk by
/// the question (a rerun asks the registry nothing).
fn resolve(
    tools: &Tools,
    sandbox: &Sandbox,
    requirements: &[String],
    as_of: &str,
    per_package: &[String],
) -> Result<Vec<String>> {
    let question = format!(
        "python {}\nas of {as_of}\n{}\n--\n{}",
        tools.python_version,
        requirements.join("\n"),
        per_package.join("\n")
    );
    let key = key_of(&question);
    let dir = tools.root.join("locks");
    std::fs::create_dir_all(&dir)?;
    let lock_path = dir.join(format!("{key}.txt"));
    if let Ok(text) = std::fs::read_to_string(&lock_path) {
        return Ok(lock_lines(&text));
    }
    // uv reads the question and writes the lock in a directory of its own; the lock is
    // read back as the sandbox's output (never through a link a build left).
    let tmp = tools.root.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    let work = tempfile::Builder::new().prefix("lock-").tempdir_in(&tmp)?;
    let input = work.path().join("requirements.in");
    let staging = work.path().join("requirements.txt");
    std::fs::write(&input, requirements.join("\n") + "\n")?;
    let s = |p: &Path| p.to_string_lossy().to_string();
    let mut args: Vec<String> = ["pip", "compile", "--quiet", "--no-header", "--no-annotate", "--exclude-newer", as_of]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(["--python".into(), s(&tools.python), "-o".into(), s(&staging), s(&input)]);
    for p in per_package {
        args.extend(["--exclude-newer-package".into(), p.clone()]);
    }
    if let Err(e) = tools.uv(sandbox, &args, &[work.path().to_path_buf()]) {
        bail!("resolving as of {as_of}: {}", uv_error(&format!("{e:#}")));
    }
    let text = read_output(&staging, work.path(), 16 << 20).context("uv wrote no lock")?;
    let part = dir.join(format!("{key}.{}.tmp", std::process::id()));
    std::fs::write(&part, &text)?;
    std::fs::rename(&part, &lock_path)?;
    Ok(lock_lines(&text))
}

fn lock_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('-'))
        .map(str::to_string)
        .collect();
    v.sort_by_key(|l| requirement_name(l));
    v
}

/// Installs `lock` into the environment named by its hash (or finds it ready), and checks
/// that the test runner starts in the sandbox. Answers (key, venv, built now).
fn install(tools: &Tools, lock: &[String], sandbox: &Sandbox) -> Result<(String, PathBuf, bool)> {
    let key = key_of(&format!("python {}\n{}", tools.python_version, lock.join("\n")));
    let venv = tools.root.join("envs").join(&key);
    let ready = venv.join(".swelake-ready");
    if ready.is_file() {
        return Ok((key, venv, false));
    }
    {
        // The environment is made at its own path (a venv names it inside), empty, and only it
        // is writable to the build.
        let _ = std::fs::remove_dir_all(&venv);
        std::fs::create_dir_all(&venv)?;
        let s = |p: &Path| p.to_string_lossy().to_string();
        let args: Vec<String> = vec![
            "venv".into(),
            "--quiet".into(),
            "--allow-existing".into(),
            "--python".into(),
            s(&tools.python),
            s(&venv),
        ];
        if let Err(e) = tools.uv(sandbox, &args, std::slice::from_ref(&venv)) {
            let _ = std::fs::remove_dir_all(&venv);
            bail!("creating the venv: {}", last_error(&format!("{e:#}")));
        }
        let lock_file = venv.join("requirements.lock");
        write_output(&lock_file, &venv, (lock.join("\n") + "\n").as_bytes())?;
        let args: Vec<String> = vec![
            "pip".into(),
            "install".into(),
            "--quiet".into(),
            "--no-deps".into(),
            "--python".into(),
            s(&venv.join("bin").join("python")),
            "-r".into(),
            s(&lock_file),
        ];
        if let Err(e) = tools.uv(sandbox, &args, std::slice::from_ref(&venv)) {
            let _ = std::fs::remove_dir_all(&venv);
            bail!("installing: {}", uv_error(&format!("{e:#}")));
        }
    }
    // The runner must start here, in the sandbox, before any PR is judged by it.
    let scratch = tempfile::Builder::new().prefix("probe-").tempdir_in(&tools.root)?;
    let log = scratch.path().join("probe.log");
    let mounts = super::sandbox::Mounts {
        read_only: vec![tools.python_prefix.clone(), venv.clone()],
        writable: vec![scratch.path().to_path_buf()],
        ..Default::default()
    };
    let argv =
        vec![venv.join("bin/python").to_string_lossy().to_string(), "-m".into(), "pytest".into(), "--version".into()];
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/tmp".to_string())];
    let exit = sandbox.run(&argv, scratch.path(), &env, &mounts, &log, std::time::Duration::from_secs(60))?;
    if exit.code != Some(0) {
        let _ = std::fs::remove_file(&ready);
        bail!(
            "pytest does not start on python {}: {}",
            tools.python_version,
            last_error(&super::sandbox::tail(&log, 5))
        );
    }
    // The environment was written by package builds: the marker must not follow a link.
    write_output(&ready, &venv, (lock.join("\n") + "\n").as_bytes())?;
    Ok((key, venv, true))
}

/// 16 hex digits of FNV-1a: a cache key.
pub fn key_of(text: &str) -> String {
    format!("{:016x}", crate::hash::fnv1a_str(text))
}

/// uv's error: the package it failed to build (its first line says which), then its last lines.
fn uv_error(text: &str) -> String {
    let failed = text.lines().find(|l| l.contains("Failed to build") || l.contains("Failed to download and build"));
    match failed {
        Some(f) => format!("{} / {}", f.trim().trim_start_matches('×').trim(), last_error(text)),
        None => last_error(text),
    }
}

/// The most telling line of a tool's error output.
fn last_error(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let pick: Vec<&str> = lines.iter().rev().take(3).rev().copied().collect();
    one_line(&pick.join(" / "))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_build_names_its_package() {
        assert_eq!(
            failed_build("× Failed to build `greenlet==0.4.15`\n├─▶ The build backend"),
            Some("greenlet".into())
        );
        assert_eq!(failed_build("nothing"), None);
    }
}
