//! A JavaScript or TypeScript tree's environment as of the PR's day: what `package.json`
//! declares resolved by npm (`npm install --package-lock-only --before <merged_at>`, or the
//! committed lockfile as it stands), installed with `npm ci --ignore-scripts` outside the
//! sandbox into a `node_modules` cached by the lock's hash. The scratch tree gets that
//! `node_modules` as a link, read-only in the sandbox; no install script of any package runs,
//! and the project's own code runs only in the sandbox.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::run::NodeRunner;
use super::NodeSpec;
use crate::verify::sandbox;
use crate::verify::toolchain::{build_once, key_of, one_line, Env, EnvRow, Tools};

/// Node and npm of this machine.
#[derive(Debug, Clone)]
pub struct NodeTools {
    pub node: PathBuf,
    pub npm: PathBuf,
    /// `20.20.2`.
    pub version: String,
    /// Where node is installed, when outside `/usr` (mounted read-only into the sandbox).
    pub prefix: Option<PathBuf>,
}

impl NodeTools {
    /// Node and npm on PATH, or why not.
    pub fn probe() -> std::result::Result<NodeTools, String> {
        let node = sandbox::which("node").ok_or("node is not installed here (no `node` on PATH)")?;
        let npm = sandbox::which("npm").ok_or("npm is not installed here (no `npm` on PATH)")?;
        let out = Command::new(&node)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("node does not run: {e}"))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().trim_start_matches('v').to_string();
        if !out.status.success() || version.is_empty() {
            return Err("node did not say its version".into());
        }
        let real = std::fs::canonicalize(&node).unwrap_or(node.clone());
        let prefix = real.parent().and_then(Path::parent).map(Path::to_path_buf).filter(|p| !p.starts_with("/usr"));
        Ok(NodeTools { node: real, npm, version, prefix })
    }

    pub(super) fn major(&self) -> &str {
        self.version.split('.').next().unwrap_or("")
    }

    /// npm with only what it needs: no credentials of the lake reach it (the user's own npm
    /// configuration, registry and proxy included, does).
    fn npm(&self, root: &Path, cwd: &Path) -> Command {
        let mut c = Command::new(&self.npm);
        c.env_clear().current_dir(cwd).stdin(Stdio::null());
        for k in ["PATH", "HOME", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"] {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        for (k, v) in std::env::vars_os() {
            if k.to_string_lossy().to_ascii_lowercase().starts_with("npm_config_") {
                c.env(k, v);
            }
        }
        c.env("npm_config_cache", root.join("npm-cache"))
            .env("npm_config_update_notifier", "false")
            .env("npm_config_fund", "false")
            .env("npm_config_audit", "false")
            .env("npm_config_loglevel", "error");
        c
    }
}

/// The environment of `spec` as of `as_of`, built or taken from the cache; `Err(row)` says
/// why it could not be. What moved from the PR's day is recorded in `relaxed`: npm 7 and later
/// refuse peer ranges npm 6 accepted (`--legacy-peer-deps`, as the PR's own npm behaved),
/// and a registry that has no release of a package dated before the PR's day (a mirror
/// that dates releases by when it copied them) is asked without the date.
pub fn prepare(
    repo: &str,
    spec: &NodeSpec,
    as_of: &str,
    node: &NodeTools,
    tools: &Tools,
    sandbox: &sandbox::Sandbox,
) -> std::result::Result<Env, Box<EnvRow>> {
    let started = Instant::now();
    let language = if spec.typescript { "typescript" } else { "javascript" };
    let mut row = EnvRow::new(repo, language, String::new(), &spec.files, spec.requirements.clone(), as_of);
    for step in &spec.lint_steps {
        row.relaxed.push(format!("lint step `{}` is not a test: skipped", one_line(step)));
    }
    row.interpreter = format!("node {}", node.version);
    row.env_key = key_of(&format!("inputs\nnode {}\n{as_of}\n{}", node.version, spec.package_json));
    let mut legacy_peers = false;
    // A committed lockfile pins every version: the date matters only without one.
    let mut dated = spec.lock.as_ref().is_none_or(|(f, _)| f == "yarn.lock");
    if !dated {
        row.resolved_as_of = format!("{} (committed)", spec.lock.as_ref().map(|l| l.0.as_str()).unwrap_or(""));
    }
    let mut errors = Vec::new();
    let lock = loop {
        match resolve(node, tools, spec, dated.then_some(as_of), legacy_peers) {
            Ok(lock) => break lock,
            Err(e) => {
                let text = format!("{e:#}");
                errors.push(text.clone());
                if !legacy_peers && text.contains("ERESOLVE") {
                    legacy_peers = true;
                    row.relaxed.push("peer dependencies: --legacy-peer-deps (npm 7+ refuses these peer ranges)".into());
                    continue;
                }
                if dated && (text.contains("ENOVERSIONS") || text.contains("ETARGET")) {
                    dated = false;
                    row.relaxed.push(format!(
                        "registry dates: no release before {as_of} for a package (the registry's publish times); \
                         resolved as of today within package.json's ranges"
                    ));
                    row.resolved_as_of = "today".into();
                    continue;
                }
                let why = if errors.len() > 1 { format!("{text} (after {} attempts)", errors.len()) } else { text };
                return row.failed(&why);
            }
        }
    };
    row.packages = lock_packages(&lock);
    match install(node, tools, sandbox, spec, &lock, legacy_peers) {
        Ok((key, dir, fresh)) => {
            row.env_key = key.clone();
            row.status = "ready".into();
            row.seconds = if fresh { started.elapsed().as_secs_f64() } else { 0.0 };
            let runner = NodeRunner {
                node: node.clone(),
                dir: dir.clone(),
                runner: spec.runner,
                args: spec.runner_args.clone(),
                script_env: spec.script_env.clone(),
                build_steps: spec.build_steps.clone(),
            };
            Ok(Env { key, dir, row, runner: Arc::new(runner) })
        }
        Err(e) => row.failed(&format!("{e:#}")),
    }
}

/// The resolved `package-lock.json` for the spec, cached by the question (a rerun asks the
/// registry nothing).
fn resolve(
    node: &NodeTools,
    tools: &Tools,
    spec: &NodeSpec,
    before: Option<&str>,
    legacy_peers: bool,
) -> Result<String> {
    let lock_text = spec.lock.as_ref().map(|(f, t)| format!("{f}\n{t}")).unwrap_or_default();
    let question = format!(
        "node {}\nbefore {}\nlegacy {legacy_peers}\n{}\n--\n{lock_text}",
        node.major(),
        before.unwrap_or("-"),
        spec.package_json
    );
    let key = key_of(&question);
    let dir = tools.root.join("node-locks");
    std::fs::create_dir_all(&dir)?;
    let cached = dir.join(format!("{key}.json"));
    if let Ok(text) = std::fs::read_to_string(&cached) {
        return Ok(text);
    }
    let staging = tempfile::Builder::new().prefix("resolve-").tempdir_in(&dir)?;
    std::fs::write(staging.path().join("package.json"), &spec.package_json)?;
    if let Some((f, t)) = &spec.lock {
        let name = if f == "npm-shrinkwrap.json" { "package-lock.json" } else { f.as_str() };
        std::fs::write(staging.path().join(name), t)?;
    }
    let mut cmd = node.npm(&tools.root, staging.path());
    cmd.args(["install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"]);
    if let Some(d) = before {
        cmd.arg(format!("--before={d}"));
    }
    if legacy_peers {
        cmd.arg("--legacy-peer-deps");
    }
    let out = cmd.output().context("running npm install --package-lock-only")?;
    if !out.status.success() {
        bail!("npm resolving: {}", npm_error(&String::from_utf8_lossy(&out.stderr)));
    }
    let lock =
        std::fs::read_to_string(staging.path().join("package-lock.json")).context("npm wrote no package-lock.json")?;
    let part = dir.join(format!("{key}.{}.tmp", std::process::id()));
    std::fs::write(&part, &lock)?;
    std::fs::rename(&part, &cached)?;
    Ok(lock)
}

/// `name==version` of every package a lock installs (nested copies once per version).
fn lock_packages(lock: &str) -> Vec<String> {
    let Ok(doc) = serde_json::from_str::<Value>(lock) else { return Vec::new() };
    let mut out = BTreeSet::new();
    if let Some(pkgs) = doc.get("packages").and_then(Value::as_object) {
        for (path, p) in pkgs {
            let Some(name) = path.rsplit_once("node_modules/").map(|(_, n)| n) else { continue };
            if let Some(v) = p.get("version").and_then(Value::as_str) {
                out.insert(format!("{name}=={v}"));
            }
        }
    }
    out.into_iter().collect()
}

/// Installs the lock into `envs/node-<hash>/node_modules` (or finds it ready) and checks that
/// the runner starts in the sandbox. Answers (key, dir, built now).
fn install(
    node: &NodeTools,
    tools: &Tools,
    sandbox: &sandbox::Sandbox,
    spec: &NodeSpec,
    lock: &str,
    legacy_peers: bool,
) -> Result<(String, PathBuf, bool)> {
    let key = key_of(&format!("node {}\nlegacy {legacy_peers}\n{lock}", node.major()));
    let dir = tools.root.join("envs").join(format!("node-{key}"));
    let build = || -> Result<()> {
        std::fs::write(dir.join("package.json"), &spec.package_json)?;
        std::fs::write(dir.join("package-lock.json"), lock)?;
        let mut cmd = node.npm(&tools.root, &dir);
        cmd.args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--include=dev"]);
        if legacy_peers {
            cmd.arg("--legacy-peer-deps");
        }
        let out = cmd.output().context("running npm ci")?;
        if !out.status.success() {
            bail!("npm ci: {}", npm_error(&String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    };
    // The runner must start here, in the sandbox, before any PR is judged by it.
    let probe = || -> Result<()> {
        let scratch = tempfile::Builder::new().prefix("probe-").tempdir_in(&tools.root)?;
        let log = scratch.path().join("probe.log");
        let mut argv = vec![node.node.to_string_lossy().to_string()];
        match spec.runner {
            // Node's own runner and TAP files need nothing but node.
            super::Runner::NodeTest | super::Runner::Tap => argv.push("--version".into()),
            r => {
                argv.push(dir.join("node_modules/.bin").join(r.commands()[0]).to_string_lossy().to_string());
                argv.extend(r.version_args().iter().map(|a| a.to_string()));
            }
        }
        let exit = sandbox_for(sandbox).run(
            &argv,
            scratch.path(),
            &base_env(node, &dir, sandbox.memory_mb),
            &mounts(node, &dir, scratch.path(), None),
            &log,
            Duration::from_secs(60),
        )?;
        if exit.code != Some(0) {
            bail!(
                "{} does not start on node {}: {}",
                spec.runner.name(),
                node.version,
                one_line(&sandbox::tail(&log, 4))
            );
        }
        Ok(())
    };
    let fresh = build_once(&dir, build, probe)?;
    Ok((key, dir, fresh))
}

/// npm's error: its `npm error` lines without the log-file hint.
fn npm_error(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start_matches("npm error").trim_start_matches("npm ERR!").trim())
        .filter(|l| !l.is_empty() && !l.contains("complete log of this run") && !l.starts_with("A complete log"))
        .collect();
    one_line(&lines.iter().take(4).copied().collect::<Vec<_>>().join(" / "))
}

/// The sandbox for node: V8 reserves address space far beyond what it uses (a code range and
/// a pointer cage per isolate, guard regions per WebAssembly memory: vitest 1.6.0's worker
/// threads need more than 6 GiB of it to start), so the address-space limit cannot bound
/// node's memory. It is lifted to 64 GiB and the heap of every node process (workers and
/// children inherit `NODE_OPTIONS`) is bounded by `--max-old-space-size` instead.
pub(super) fn sandbox_for(sandbox: &sandbox::Sandbox) -> sandbox::Sandbox {
    let mut s = sandbox.clone();
    s.memory_mb = s.memory_mb.max(64 << 10);
    s
}

pub(super) fn base_env(node: &NodeTools, dir: &Path, memory_mb: u64) -> Vec<(String, String)> {
    let mut path = format!("{}:/usr/bin:/bin", dir.join("node_modules/.bin").display());
    if let Some(p) = &node.prefix {
        path = format!("{}:{path}", p.join("bin").display());
    }
    let mut env = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), "/tmp".to_string()),
        ("CI".to_string(), "true".to_string()),
        ("FORCE_COLOR".to_string(), "0".to_string()),
        ("NO_COLOR".to_string(), "1".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TZ".to_string(), "UTC".to_string()),
    ];
    env.push(("NODE_OPTIONS".to_string(), format!("--max-old-space-size={memory_mb}")));
    env
}

pub(super) fn mounts(node: &NodeTools, env_dir: &Path, writable: &Path, reporter: Option<&Path>) -> sandbox::Mounts {
    let mut read_only = vec![env_dir.to_path_buf()];
    read_only.extend(node.prefix.clone());
    read_only.extend(reporter.map(Path::to_path_buf));
    sandbox::Mounts { read_only, writable: vec![writable.to_path_buf()], ..Default::default() }
}
