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
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::interp::Interpreter;
use super::spec::{is_tooling, normalize, requirement_name, Spec};
use crate::verify::sandbox::{read_output, write_output, Mounts, RunOptions, Sandbox};
use crate::verify::toolchain::{build_once, key_of, one_line, Env, EnvRow, Tools};
use crate::verify::VerifyConfig;

/// A uv binary fetched on first use, shared by every interpreter of a run; `Err`: why there
/// is none.
pub type FetchedUv = Arc<OnceLock<std::result::Result<PathBuf, String>>>;

/// uv and one interpreter: what an environment is built with.
#[derive(Debug, Clone)]
pub struct PyTools {
    /// uv, fetched the first time a Python environment needs it (a lake of JavaScript
    /// repositories never asks PyPI for it); `Err`: why it could not be had. Shared by every
    /// interpreter of a run.
    uv: FetchedUv,
    uv_version: String,
    /// `[verify] uv_legacy_version` and its uv, fetched the first time a resolution needs it.
    legacy: Option<(String, FetchedUv)>,
    /// The interpreter whose pip fetches uv: the newest of the run's, the same whichever
    /// interpreter a PR gets (pip of 3.6 finds no uv release for it).
    uv_fetcher: PathBuf,
    /// The interpreter's own executable (not a shim).
    pub python: PathBuf,
    /// `3.11.7`.
    pub python_version: String,
    /// `sys.base_prefix`: mounted read-only into the sandbox.
    pub python_prefix: PathBuf,
    /// Locks, environments, scratch trees.
    pub root: PathBuf,
}

impl PyTools {
    /// The tools of `[verify] python` (the first of `pythons` when set), for a caller that
    /// builds environments directly.
    pub fn prepare(cfg: &VerifyConfig, cache: &Path) -> Result<PyTools> {
        let tools = Tools::prepare(cfg, cache)?;
        let kit = super::kit(&tools);
        let interp = kit.interpreters.first().ok_or_else(|| anyhow::anyhow!("{}", kit.problems.join("; ")))?;
        Ok(PyTools::new(&kit, interp))
    }

    /// uv of `kit` with the interpreter `interp`.
    pub fn new(kit: &super::PythonKit, interp: &Interpreter) -> PyTools {
        PyTools {
            uv: kit.uv.clone(),
            uv_version: kit.uv_version.clone(),
            legacy: (!kit.uv_legacy_version.is_empty() && kit.uv_legacy_version != kit.uv_version)
                .then(|| (kit.uv_legacy_version.clone(), kit.legacy_uv.clone())),
            uv_fetcher: kit.newest().map_or_else(|| interp.exe.clone(), |i| i.exe.clone()),
            python: interp.exe.clone(),
            python_version: interp.version.clone(),
            python_prefix: interp.prefix.clone(),
            root: kit.root.clone(),
        }
    }

    /// uv, fetched on the first call; `Err`: why there is none.
    pub fn uv_path(&self) -> std::result::Result<PathBuf, String> {
        self.uv
            .get_or_init(|| {
                let python = self.uv_fetcher.to_string_lossy();
                fetch_uv(&self.uv_version, &self.root, &python).map_err(|e| format!("{e:#}"))
            })
            .clone()
    }

    /// These tools with the legacy uv in place of uv, when one is configured and takes this
    /// interpreter (uv 0.8 refuses Pythons before 3.8, which uv 0.13 still drives).
    fn with_legacy_uv(&self) -> Option<PyTools> {
        let minor: u32 = self.python_version.split('.').nth(1).and_then(|m| m.parse().ok())?;
        if minor < 8 {
            return None;
        }
        let (version, uv) = self.legacy.clone()?;
        Some(PyTools { uv, uv_version: version, legacy: None, ..self.clone() })
    }

    /// The interpreter's prefix to mount read-only into a sandbox.
    pub fn python_mounts(&self) -> Vec<PathBuf> {
        vec![self.python_prefix.clone()]
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
        self.uv_with(sandbox, args, writable, &[])
    }

    /// [`PyTools::uv`] with more read-only mounts (an environment whose interpreter it installs for).
    fn uv_with(&self, sandbox: &Sandbox, args: &[String], writable: &[PathBuf], seen: &[PathBuf]) -> Result<String> {
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
        read_only.extend(seen.iter().cloned());
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
pub(super) fn probe_python(python: &str) -> std::result::Result<[String; 3], String> {
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
pub(super) fn fetch_uv(version: &str, root: &Path, python: &str) -> Result<PathBuf> {
    if version.is_empty() {
        return crate::verify::sandbox::which("uv")
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
        // uv builds an sdist without a pyproject.toml with setuptools>=40.8.0, on PyPI between
        // 2019-02-01 (uv finds only 40.7.1 as of then) and 2019-02-06: older interpreters'
        // build backends float no earlier than that.
        "3.6" | "3.7" => "2019-02-06T00:00:00Z",
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
    tools: &PyTools,
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
    let mut tools = std::borrow::Cow::Borrowed(tools);
    let mut legacy_note: Option<String> = None;
    // Each failure may float one more thing; a few rounds settle every case seen.
    for _ in 0..10 {
        let per_package: Vec<String> = floated.iter().map(|n| format!("{n}={floor}")).collect();
        let attempt = resolve(&tools, sandbox, &row.requirements, as_of, &per_package)
            .map(|lock| (install(&tools, &lock, sandbox).map_err(|e| (e, lock.clone())), lock));
        let err = match attempt {
            Ok((Ok((key, venv, fresh)), lock)) => {
                row.relaxed = relaxed_pins(first_lock.as_deref().unwrap_or(&[]), &lock, &floated);
                row.relaxed.extend(legacy_note.take());
                row.packages = lock;
                row.env_key = key.clone();
                row.status = "ready".into();
                row.seconds = if fresh { started.elapsed().as_secs_f64() } else { 0.0 };
                let install = spec.install_reason.as_ref().map(|why| {
                    row.relaxed.push(format!("the project is installed into each side's tree ({why})"));
                    super::Install { tools: tools.as_ref().clone(), as_of: as_of.to_string(), floor: floor.to_string() }
                });
                let runner = super::Pytest {
                    venv: venv.clone(),
                    python_prefix: tools.python_prefix.clone(),
                    install,
                    junit_family: super::takes_junit_family(&row.packages),
                    color_option: super::pytest_at_least(&row.packages, (3, 0)),
                };
                return Ok(Env { key, dir: venv, row, runner: Arc::new(runner) });
            }
            Ok((Err((e, lock)), _)) => {
                first_lock.get_or_insert(lock);
                e
            }
            Err(e) => e,
        };
        let text = format!("{err:#}");
        errors.push(text.clone());
        // A release of the PR's day refused by its file's name is what its day installed:
        // the legacy uv reads it, before anything floats.
        if let (Some((sdist, _)), None) = (refused_sdist(&text), &legacy_note) {
            if let Some(legacy) = tools.with_legacy_uv() {
                legacy_note =
                    Some(format!("uv {} (uv {} refuses {sdist} by its name)", legacy.uv_version, tools.uv_version));
                tools = std::borrow::Cow::Owned(legacy);
                continue;
            }
        }
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
            match resolve(&tools, sandbox, &tooling, floor, &builders) {
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

/// Installs the project of `tree` (its own code: in the sandbox, as the build uid, with the
/// network for its build backend) into `site`, without its dependencies (the environment has
/// them): a wheel built from the tree as it stands, so a side gets its own entry points,
/// metadata and compiled extensions, and a patched tree is rebuilt. The build backends resolve
/// as of the PR's day, floated to the interpreter's months as environments' are.
pub fn install_project(
    tools: &PyTools,
    sandbox: &Sandbox,
    venv: &Path,
    tree: &Path,
    site: &Path,
    as_of: &str,
    floor: &str,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(site);
    std::fs::create_dir_all(site)?;
    let s = |p: &Path| p.to_string_lossy().to_string();
    let mut args: Vec<String> = vec![
        "pip".into(),
        "install".into(),
        "--quiet".into(),
        "--no-deps".into(),
        // The environment's interpreter: the scripts it writes start in the environment.
        "--python".into(),
        s(&venv.join("bin/python")),
        "--target".into(),
        s(site),
        "--exclude-newer".into(),
        as_of.into(),
    ];
    for b in BUILD_BACKENDS {
        args.extend(["--exclude-newer-package".into(), format!("{b}={floor}")]);
    }
    args.push(s(tree));
    let side = site.parent().unwrap_or(site).to_path_buf();
    tools
        .uv_with(sandbox, &args, &[side], &[venv.to_path_buf()])
        .map_err(|e| anyhow::anyhow!("installing the project: {}", uv_error(&format!("{e:#}"))))?;
    Ok(())
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

/// The package uv could not build (``Failed to build `greenlet==0.4.15` ``), or whose
/// release of the PR's day uv refuses by its file's name (an sdist such as
/// `Twisted-19.10.0.tar.bz2`, not named as PEP 625 asks), by its normal name: floated to a
/// release of the interpreter's months, it builds or comes as a wheel.
fn failed_build(text: &str) -> Option<String> {
    let re = regex::Regex::new(r"Failed to (?:build|download and build) `([A-Za-z0-9._-]+?)(?:==[^`]*)?`")
        .expect("a valid pattern");
    if let Some(c) = re.captures(text) {
        return Some(normalize(&c[1]));
    }
    refused_sdist(text).map(|(_, package)| package)
}

/// What uv refused by its file's name — the sdist (`Twisted-19.10.0.tar.bz2`), or "every
/// sdist of twisted" — and the package's normal name.
fn refused_sdist(text: &str) -> Option<(String, String)> {
    let file = regex::Regex::new(
        r"(([A-Za-z0-9][A-Za-z0-9._]*?)-\d[A-Za-z0-9.+!_]*\.(?:tar\.bz2|tar\.xz|tar\.gz|tgz|tar|zip|egg))\b",
    )
    .expect("a valid pattern");
    let every = regex::Regex::new(r"all versions of ([A-Za-z0-9._-]+) have a non-PEP 625").expect("a valid pattern");
    text.lines().filter(|l| l.contains("PEP 625") || l.contains("source distribution filename")).find_map(|l| {
        file.captures(l)
            .map(|c| (c[1].to_string(), normalize(&c[2])))
            .or_else(|| every.captures(l).map(|c| (format!("every sdist of {}", &c[1]), normalize(&c[1]))))
    })
}

/// `name==version` lines resolved by uv for `requirements` as of `as_of`, cached on disk by
/// the question (a rerun asks the registry nothing).
fn resolve(
    tools: &PyTools,
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
fn install(tools: &PyTools, lock: &[String], sandbox: &Sandbox) -> Result<(String, PathBuf, bool)> {
    let key = key_of(&format!("python {}\n{}", tools.python_version, lock.join("\n")));
    let venv = tools.root.join("envs").join(&key);
    let s = |p: &Path| p.to_string_lossy().to_string();
    // The environment is made at its own path (a venv names it inside), empty, and only it is
    // writable to the build.
    let build = || -> Result<()> {
        let args: Vec<String> = vec![
            "venv".into(),
            "--quiet".into(),
            "--allow-existing".into(),
            "--python".into(),
            s(&tools.python),
            s(&venv),
        ];
        if let Err(e) = tools.uv(sandbox, &args, std::slice::from_ref(&venv)) {
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
            bail!("installing: {}", uv_error(&format!("{e:#}")));
        }
        Ok(())
    };
    // The runner must start here, in the sandbox, before any PR is judged by it.
    let probe = || -> Result<()> {
        let scratch = tempfile::Builder::new().prefix("probe-").tempdir_in(&tools.root)?;
        let log = scratch.path().join("probe.log");
        let mounts = Mounts {
            read_only: vec![tools.python_prefix.clone(), venv.clone()],
            writable: vec![scratch.path().to_path_buf()],
            ..Default::default()
        };
        let argv = vec![s(&venv.join("bin/python")), "-m".into(), "pytest".into(), "--version".into()];
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/tmp".to_string())];
        let exit = sandbox.run(&argv, scratch.path(), &env, &mounts, &log, Duration::from_secs(60))?;
        if exit.code != Some(0) {
            bail!(
                "pytest does not start on python {}: {}",
                tools.python_version,
                last_error(&crate::verify::sandbox::tail(&log, 5))
            );
        }
        Ok(())
    };
    let fresh = build_once(&venv, build, probe)?;
    Ok((key, venv, fresh))
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
        assert_eq!(
            failed_build("error: Not a PEP 625-compliant source distribution filename: `Twisted-19.10.0.tar.bz2`"),
            Some("twisted".into())
        );
        // uv 0.13's words when no release of the day has a wheel.
        let every = "cause: Because all versions of twisted have a non-PEP 625-compliant source distribution filename \
                     and you require twisted, we can conclude that your requirements are unsatisfiable.";
        assert_eq!(refused_sdist(every), Some(("every sdist of twisted".into(), "twisted".into())));
        assert_eq!(failed_build(every), Some("twisted".into()));
    }
}
