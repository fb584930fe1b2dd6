//! The trainers' own Python tools, for the tests whose output reaches them: Hugging Face
//! `datasets`, the `swebench` package, pytest, and the `swelake_reward` wheel built from
//! `crates/swelake-reward/python` with maturin.
//!
//! They live in a virtual environment under the cache (`~/.cache/swelake/py-venv`, or
//! `SWELAKE_PY_VENV`), made and filled from PyPI on first use with the pins of
//! `tests/python/requirements.txt`; the wheel is rebuilt (incrementally, in a target directory
//! of its own so the test build's is not touched) and reinstalled once per test run. Without
//! PyPI the tests that need them are skipped with a line saying so, unless
//! `SWELAKE_REQUIRE_PYTHON=1` (CI), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cache() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".cache/swelake")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn prepare() -> Result<PathBuf, String> {
    let venv = std::env::var_os("SWELAKE_PY_VENV").map(PathBuf::from).unwrap_or_else(|| cache().join("py-venv"));
    let python = venv.join("bin/python");
    let requirements = root().join("tests/python/requirements.txt");
    let stamp = venv.join("swelake-requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).map_err(|e| format!("{}: {e}", requirements.display()))?;
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    }
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(
            Command::new(&python).args(["-m", "pip", "install", "--quiet", "-r"]).arg(&requirements),
            "pip install -r tests/python/requirements.txt",
        )?;
        std::fs::write(&stamp, &wanted).map_err(|e| e.to_string())?;
    }
    let wheels = wheel_dir();
    let _ = std::fs::remove_dir_all(&wheels);
    run(
        Command::new(venv.join("bin/maturin"))
            .args(["build", "--release", "--quiet", "--interpreter"])
            .arg(&python)
            .arg("--manifest-path")
            .arg(root().join("crates/swelake-reward/python/Cargo.toml"))
            .arg("--out")
            .arg(&wheels)
            .env("CARGO_TARGET_DIR", cache().join("target-py")),
        "maturin build (the swelake_reward wheel)",
    )?;
    let wheel = wheel().ok_or("maturin wrote no wheel")?;
    run(
        Command::new(&python).args(["-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps"]).arg(&wheel),
        "pip install the swelake_reward wheel",
    )?;
    Ok(python)
}

/// Where the wheel built by [`python`] is.
fn wheel_dir() -> PathBuf {
    cache().join("wheels")
}

fn wheel() -> Option<PathBuf> {
    std::fs::read_dir(wheel_dir())
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
}

/// A new, empty venv (in a scratch directory that lives as long as the first value) with only
/// the `swelake_reward` wheel, pytest and pyarrow installed: the wheel's tests run there, so a
/// dependency the wheel forgot to declare cannot hide behind the tools' venv. `None` where
/// [`python`] is.
pub fn clean_venv() -> Option<(tempfile::TempDir, PathBuf)> {
    python()?;
    let dir = tempfile::tempdir().unwrap();
    let py = dir.path().join("bin/python");
    let made =
        run(Command::new("python3").args(["-m", "venv"]).arg(dir.path()), "python3 -m venv (clean)").and_then(|_| {
            let pins: Vec<String> = std::fs::read_to_string(root().join("tests/python/requirements.txt"))
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("pytest==") || l.starts_with("pyarrow=="))
                .map(str::to_string)
                .collect();
            run(
                Command::new(&py).args(["-m", "pip", "install", "--quiet"]).args(&pins).arg(wheel().unwrap()),
                "pip install the wheel into a clean venv",
            )
        });
    match made {
        Ok(()) => Some((dir, py)),
        Err(e) => panic!("{e}"),
    }
}

/// The environment's python, or `None` (with a line saying why) where it cannot be made.
pub fn python() -> Option<PathBuf> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PY.get_or_init(prepare) {
        Ok(p) => Some(p.clone()),
        Err(e) if std::env::var("SWELAKE_REQUIRE_PYTHON").is_ok_and(|v| v == "1") => {
            panic!("the Python tools are required (SWELAKE_REQUIRE_PYTHON=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: the Python tools (datasets, swebench, the swelake_reward wheel) are unavailable: {e}");
            None
        }
    }
}

/// Runs `tests/python/SCRIPT` with `args` in the environment; returns its stdout, failing the
/// test with its output when it fails.
pub fn script(python: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(python);
    cmd.arg(root().join("tests/python").join(script))
        .args(args)
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1");
    // datasets caches what it loads; a scratch cache per call keeps runs independent.
    let hf = tempfile::tempdir().unwrap();
    cmd.env("HF_HOME", hf.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("running {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
