//! Python: what the tree declares ([`spec`]), the interpreter of the PR's era among those the
//! operator lists ([`interp`]), an environment as of the PR's day built by uv in the sandbox
//! ([`mod@env`]), and pytest run on the PR's test modules with its JUnit report read per test.

pub mod env;
pub mod interp;
pub mod spec;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::outcomes;
use super::sandbox::{self, Mounts, Sandbox};
use super::toolchain::{EnvStop, Missing, Prepared, RunCtx, RunOutcome, Side, Status, TestRunner, Toolchain, Tools};
use super::PrRef;
use interp::{Interpreter, NoInterpreter};

/// The Python toolchain.
pub struct Python;

/// What Python trees share in a run: the interpreters of `[verify] pythons` (else `python`)
/// that run here, why the others do not, and uv (fetched on first use).
pub struct PythonKit {
    pub interpreters: Vec<Interpreter>,
    pub problems: Vec<String>,
    uv: env::FetchedUv,
    uv_version: String,
    legacy_uv: env::FetchedUv,
    uv_legacy_version: String,
    root: PathBuf,
}

impl PythonKit {
    /// The newest interpreter of the run.
    pub fn newest(&self) -> Option<&Interpreter> {
        self.interpreters.iter().max_by_key(|i| interp::version_key(&i.version))
    }
}

/// The run's Python kit, probed on the first call.
pub fn kit(tools: &Tools) -> Arc<PythonKit> {
    tools.kit("python", |t| {
        let listed: Vec<String> =
            if t.cfg.pythons.is_empty() { vec![t.cfg.python.clone()] } else { t.cfg.pythons.clone() };
        let mut interpreters: Vec<Interpreter> = Vec::new();
        let mut problems = Vec::new();
        for p in &listed {
            match env::probe_python(p) {
                Ok([exe, version, prefix]) => {
                    let i = Interpreter { exe: exe.into(), version, prefix: prefix.into() };
                    if !interpreters.iter().any(|o| o.version == i.version) {
                        interpreters.push(i);
                    }
                }
                Err(why) => problems.push(why),
            }
        }
        PythonKit {
            interpreters,
            problems,
            uv: Arc::default(),
            uv_version: t.cfg.uv_version.clone(),
            legacy_uv: Arc::default(),
            uv_legacy_version: t.cfg.uv_legacy_version.clone(),
            root: t.root.clone(),
        }
    })
}

impl Toolchain for Python {
    fn name(&self) -> &'static str {
        "python"
    }

    fn project_files(&self) -> &'static [&'static str] {
        &["pyproject.toml", "setup.py", "setup.cfg"]
    }

    fn test_file_kinds(&self) -> &'static str {
        "test_*.py, *_test.py"
    }

    fn prepare(
        &self,
        read: &dyn Fn(&str) -> Option<String>,
        pr: &PrRef,
        tools: &Tools,
        sandbox: &Sandbox,
    ) -> std::result::Result<Prepared, EnvStop> {
        let spec = spec::read_spec(read);
        let kit = kit(tools);
        if kit.interpreters.is_empty() {
            return Err(EnvStop::new(Status::ToolchainUnavailable, kit.problems.join("; "), &spec.version));
        }
        let interp = interp::choose(&kit.interpreters, &spec, &pr.merged_at).map_err(|no| match no {
            NoInterpreter::Python2(why) => EnvStop::new(Status::ToolchainUnavailable, why, &spec.version),
            NoInterpreter::NotMet(why) => EnvStop::new(Status::EnvFailed, why, &spec.version),
        })?;
        let py = env::PyTools::new(&kit, interp);
        if let Err(why) = py.uv_path() {
            let why = why.trim_start_matches("toolchain_unavailable: ").to_string();
            return Err(EnvStop::new(Status::ToolchainUnavailable, why, &spec.version));
        }
        match env::prepare(&pr.repo_name, &spec, &pr.merged_at, &py, sandbox, tools.cfg.relax_tooling) {
            Ok(env) => Ok(Prepared { env, version: spec.version.unwrap_or_default() }),
            Err(row) => Err(EnvStop::failed(row, &pr.merged_at, spec.version)),
        }
    }
}

/// pytest in a virtual environment.
#[derive(Debug, Clone)]
pub struct Pytest {
    pub venv: PathBuf,
    /// The interpreter's prefix, mounted read-only.
    pub python_prefix: PathBuf,
    /// When the tree must be installed to run its tests ([`spec::Spec::install_reason`]).
    pub install: Option<Install>,
    /// Whether its pytest takes `-o junit_family=xunit1` (5.4 and later need it to report each
    /// test's file; pytest before 3.0 has no `-o` and refuses the run).
    pub junit_family: bool,
    /// Whether its pytest takes `--color=no` (pytest 2.4 refuses the run; its output is not a
    /// terminal, so it writes no colours anyway).
    pub color_option: bool,
}

/// Whether a lock's pytest is 5.4 or later (or not pinned there: today's).
pub fn takes_junit_family(lock: &[String]) -> bool {
    pytest_at_least(lock, (5, 4))
}

/// Whether a lock's pytest is `version` or later (or not pinned there: today's).
pub fn pytest_at_least(lock: &[String], version: (u32, u32)) -> bool {
    let Some(v) = lock.iter().find_map(|l| l.strip_prefix("pytest==")) else { return true };
    let mut parts = v.split('.').map(|x| x.chars().take_while(char::is_ascii_digit).collect::<String>());
    let major: u32 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(u32::MAX);
    let minor: u32 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    (major, minor) >= version
}

/// How a side's tree is installed: uv and the interpreter, the PR's day and the build
/// backends' floor.
#[derive(Debug, Clone)]
pub struct Install {
    pub tools: env::PyTools,
    pub as_of: String,
    pub floor: String,
}

impl TestRunner for Pytest {
    fn name(&self) -> &'static str {
        "pytest"
    }

    /// A tree that must be installed is, into the side's `site/` (in the sandbox: building it
    /// runs the project's own code), each side from its own tree: the fix's entry points and
    /// extensions are the after side's.
    ///
    /// A tree that does not install (a `setup.py` of 2013 on today's setuptools) is run from
    /// `PYTHONPATH` as every other tree is; why is left in `out/<side>-install.log`.
    fn before_runs(&self, ctx: &RunCtx<'_>) -> std::result::Result<(), String> {
        let Some(i) = &self.install else { return Ok(()) };
        let site = ctx.side_dir.join("site");
        if let Err(e) = env::install_project(&i.tools, ctx.sandbox, &self.venv, ctx.tree, &site, &i.as_of, &i.floor) {
            let _ = std::fs::remove_dir_all(&site);
            let out = ctx.side_dir.join("out");
            let _ = std::fs::create_dir_all(&out);
            let note = format!("not installed, run from PYTHONPATH: {e:#}\n");
            let _ =
                sandbox::write_output(&out.join(format!("{}-install.log", ctx.label)), ctx.side_dir, note.as_bytes());
        }
        Ok(())
    }

    /// pytest on `modules` in the tree, in the sandbox: only the side's directory (the tree and
    /// its reports) is writable.
    fn run(&self, ctx: &RunCtx<'_>, modules: &[String]) -> Result<RunOutcome> {
        let out = ctx.side_dir.join("out");
        std::fs::create_dir_all(&out)?;
        let junit = out.join(format!("{}.xml", ctx.label));
        let log = out.join(format!("{}.log", ctx.label));
        let _ = std::fs::remove_file(&junit);
        let mut argv: Vec<String> = vec![
            self.venv.join("bin/python").to_string_lossy().to_string(),
            "-m".into(),
            "pytest".into(),
            "-p".into(),
            "no:cacheprovider".into(),
        ];
        if self.junit_family {
            argv.extend(["-o".into(), "junit_family=xunit1".into()]);
        }
        argv.extend([format!("--junitxml={}", junit.display()), "-q".into()]);
        if self.color_option {
            argv.push("--color=no".into());
        }
        argv.push("-rN".into());
        if !ctx.cfg.whole_suite {
            argv.extend(modules.iter().cloned());
        }
        let src = ctx.tree.join("src");
        let tree_path = if src.is_dir() { src } else { ctx.tree.to_path_buf() };
        // The installed project (its metadata, entry points, built extensions) first.
        let site = ctx.side_dir.join("site");
        let installed = self.install.is_some() && site.is_dir();
        let pythonpath = if installed {
            format!("{}:{}", site.display(), tree_path.display())
        } else {
            tree_path.to_string_lossy().to_string()
        };
        let site_bin = if installed { format!(":{}", site.join("bin").display()) } else { String::new() };
        let envs = vec![
            ("PATH".to_string(), format!("{}{}:/usr/bin:/bin", self.venv.join("bin").display(), site_bin)),
            ("HOME".to_string(), "/tmp".to_string()),
            ("PYTHONPATH".to_string(), pythonpath),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
            ("PYTHONHASHSEED".to_string(), "0".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("TZ".to_string(), "UTC".to_string()),
        ];
        let mounts = Mounts {
            read_only: vec![self.python_prefix.clone(), self.venv.clone()],
            writable: vec![ctx.side_dir.to_path_buf()],
            ..Default::default()
        };
        let exit = ctx.sandbox.run(&argv, ctx.tree, &envs, &mounts, &log, Duration::from_secs(ctx.cfg.timeout_secs))?;
        let tail = super::runner::without_durations(&sandbox::tail(&log, 15));
        if exit.timed_out {
            return Ok(RunOutcome::TimedOut(tail));
        }
        // The report is the run's own file: read without following a link it may have left.
        match sandbox::read_output(&junit, ctx.side_dir, 256 << 20) {
            Ok(xml) => Ok(RunOutcome::Report(outcomes::parse_junit(&xml)?, tail)),
            Err(_) => Ok(RunOutcome::NoReport(exit.code, tail)),
        }
    }

    fn missing_report(&self, side: Side, code: Option<i32>) -> Missing {
        match (side, code) {
            // pytest's exit status 5: no test was collected.
            (_, Some(5)) => Missing::NoTests,
            // 4 before any report: a conftest.py that does not import — the PR's test changes
            // import what its fix adds, so its tests are absent before it, as a test module
            // that does not collect. (After the fix the same is the environment's failure.)
            (Side::Before, Some(4)) => Missing::Absent,
            _ => Missing::Failed,
        }
    }

    /// pytest's `E   ` lines, else the last line.
    fn error_line(&self, tail: &str) -> String {
        let lines: Vec<&str> = tail.lines().collect();
        lines
            .iter()
            .rev()
            .find(|l| l.starts_with("E ") && l.trim().len() > 2)
            .or(lines.last())
            .map(|l| l.trim_start_matches('E').trim().to_string())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn junit_family_only_where_pytest_has_it() {
        let lock = |v: &str| vec!["py==1.4.31".to_string(), format!("pytest=={v}")];
        assert!(!super::takes_junit_family(&lock("2.8.5")));
        assert!(!super::takes_junit_family(&lock("5.3.5")));
        assert!(super::takes_junit_family(&lock("5.4.0")));
        assert!(super::takes_junit_family(&lock("8.3.2")));
        assert!(super::takes_junit_family(&lock("10.0.0rc1")));
        assert!(super::takes_junit_family(&["iniconfig==2.0.0".to_string()]));
        assert!(!super::pytest_at_least(&lock("2.4.2"), (3, 0)) && super::pytest_at_least(&lock("3.0.7"), (3, 0)));
    }
}
