//! JavaScript and TypeScript environments and runs, beside Python's: what `package.json`
//! declares (its dependencies, the test runner its `test` script calls — jest, vitest or
//! mocha — and that script's options), resolved by npm as of the PR's day
//! (`npm install --package-lock-only --before <merged_at>`, or the committed lockfile as it
//! stands), installed with `npm ci --ignore-scripts` outside the sandbox into a `node_modules`
//! cached by the lock's hash. The scratch tree gets that `node_modules` as a link, read-only in
//! the sandbox; no install script of any package runs, and the project's own code runs only in
//! the sandbox.
//!
//! Per-test outcomes come from the runner's machine format ([`super::outcomes`]): jest's and
//! vitest's `--json` reports (the same shape) and, for mocha, a reporter of our own that writes
//! one JSON record per test to a file (mocha's JSON reporter writes to stdout, where the tests'
//! own output lands too).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::env::{key_of, one_line, Env, EnvRow, Tools};
use super::runner::RunOutcome;
use super::{sandbox, VerifyConfig};

/// The test runners whose results can be read per test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    Jest,
    Vitest,
    Mocha,
}

impl Runner {
    pub fn name(self) -> &'static str {
        match self {
            Runner::Jest => "jest",
            Runner::Vitest => "vitest",
            Runner::Mocha => "mocha",
        }
    }

    /// Options of the project's `test` script that change what its tests see (a config, a
    /// `--require` hook, a timeout); reporters, watch modes and file globs are ours to set.
    /// `(flag, takes a value)`.
    fn kept_options(self) -> &'static [(&'static str, bool)] {
        match self {
            Runner::Mocha => &[
                ("--require", true),
                ("-r", true),
                ("--timeout", true),
                ("-t", true),
                ("--ui", true),
                ("-u", true),
                ("--compilers", true),
                ("--file", true),
                ("--extension", true),
                ("--config", true),
                ("--package", true),
                ("--opts", true),
                ("--node-option", true),
                ("-n", true),
                ("--slow", true),
                ("--recursive", false),
                ("--exit", false),
                ("--check-leaks", false),
                ("--no-timeouts", false),
                ("--delay", false),
            ],
            Runner::Jest => &[
                ("--config", true),
                ("-c", true),
                ("--setupFiles", true),
                ("--testEnvironment", true),
                ("--env", true),
                ("--rootDir", true),
                ("--roots", true),
                ("--preset", true),
                ("--forceExit", false),
            ],
            Runner::Vitest => &[
                ("--config", true),
                ("-c", true),
                ("--root", true),
                ("--dir", true),
                ("--environment", true),
                ("--globals", false),
            ],
        }
    }

    /// The names a script calls it by (`node_modules/.bin` entries).
    fn commands(self) -> &'static [&'static str] {
        match self {
            Runner::Jest => &["jest", "jest-cli"],
            Runner::Vitest => &["vitest"],
            Runner::Mocha => &["mocha", "_mocha"],
        }
    }
}

const RUNNERS: [Runner; 3] = [Runner::Vitest, Runner::Jest, Runner::Mocha];

/// What a tree's `package.json` declares for its tests.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Files read, in order.
    pub files: Vec<String>,
    pub package_json: String,
    /// The committed lockfile (`package-lock.json`, `npm-shrinkwrap.json`, `yarn.lock`): name, text.
    pub lock: Option<(String, String)>,
    pub runner: Runner,
    /// The `test` script's options for the runner that change what its tests see.
    pub runner_args: Vec<String>,
    /// `NAME=value` set in front of the runner by the script (`NODE_ENV=test mocha …`,
    /// `cross-env TZ=UTC jest`).
    pub script_env: Vec<(String, String)>,
    /// `name@range` of dependencies and devDependencies, sorted.
    pub requirements: Vec<String>,
    pub version: Option<String>,
    pub typescript: bool,
}

/// Reads the spec from the tree (`read(path)` gives a file's text); `Err` says why the tree
/// cannot be run here (no package.json runner that reports per test).
pub fn read_spec(read: &dyn Fn(&str) -> Option<String>) -> std::result::Result<NodeSpec, String> {
    let text = read("package.json").ok_or("no package.json at the merge base")?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("package.json is not JSON: {e}"))?;
    let mut files = vec!["package.json".to_string()];
    let lock = ["package-lock.json", "npm-shrinkwrap.json", "yarn.lock"]
        .iter()
        .find_map(|f| read(f).map(|t| (f.to_string(), t)));
    if let Some((f, _)) = &lock {
        files.push(f.clone());
    }
    let typescript = read("tsconfig.json").is_some();
    if typescript {
        files.push("tsconfig.json".into());
    }
    let mut requirements = BTreeSet::new();
    let mut deps = BTreeSet::new();
    for section in ["dependencies", "devDependencies"] {
        if let Some(m) = doc.get(section).and_then(Value::as_object) {
            for (name, range) in m {
                deps.insert(name.clone());
                requirements.insert(format!("{name}@{}", range.as_str().unwrap_or("*")));
            }
        }
    }
    if doc.get("workspaces").is_some() {
        return Err("package.json declares workspaces (a monorepo): only single-package trees are built".into());
    }
    let script = doc.pointer("/scripts/test").and_then(Value::as_str).unwrap_or("").to_string();
    let from_script = script_runner(&expand_scripts(&doc, &script, 0));
    let runner = match from_script {
        Some((r, _, _)) => r,
        None => RUNNERS.into_iter().find(|r| r.commands().iter().any(|c| deps.contains(*c))).ok_or_else(|| {
            format!(
                "no test runner that reports per test (jest, vitest, mocha) in package.json (test script: `{}`)",
                one_line(&script)
            )
        })?,
    };
    let (runner_args, script_env) = from_script.map(|(_, a, e)| (a, e)).unwrap_or_default();
    Ok(NodeSpec {
        files,
        package_json: text,
        lock,
        runner,
        runner_args,
        script_env,
        requirements: requirements.into_iter().collect(),
        version: doc.get("version").and_then(Value::as_str).map(str::to_string),
        typescript,
    })
}

/// `NAME=value` pairs.
type Vars = Vec<(String, String)>;

/// The runner a `test` script calls, the options it passes that are kept, and the variables it
/// sets in front (`NODE_ENV=test mocha -r ts-node/register 'test/**/*.ts' && eslint .`).
fn script_runner(script: &str) -> Option<(Runner, Vec<String>, Vars)> {
    for segment in script.split(['&', ';', '|']) {
        let words = shell_words(segment);
        let at = words.iter().position(|w| {
            let base = w.rsplit('/').next().unwrap_or(w);
            RUNNERS.iter().any(|r| r.commands().contains(&base))
        });
        let Some(at) = at else { continue };
        let base = words[at].rsplit('/').next().unwrap_or(&words[at]).to_string();
        let runner = RUNNERS.into_iter().find(|r| r.commands().contains(&base.as_str()))?;
        let env: Vec<(String, String)> = words[..at]
            .iter()
            .filter_map(|w| w.split_once('='))
            .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .filter(|(k, _)| !["PATH", "HOME"].contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let kept = runner.kept_options();
        let mut args = Vec::new();
        let mut rest = words[at + 1..].iter();
        while let Some(w) = rest.next() {
            let (flag, inline) = match w.split_once('=') {
                Some((f, v)) if f.starts_with('-') => (f, Some(v)),
                _ => (w.as_str(), None),
            };
            // `vitest run`: the subcommand is ours to give.
            if runner == Runner::Vitest && ["run", "watch", "dev"].contains(&flag) {
                continue;
            }
            match kept.iter().find(|(f, _)| *f == flag) {
                Some((_, true)) => match inline {
                    Some(v) => args.push(format!("{flag}={v}")),
                    None => {
                        if let Some(v) = rest.next() {
                            args.push(flag.to_string());
                            args.push(v.clone());
                        }
                    }
                },
                Some((_, false)) => args.push(w.clone()),
                None => {}
            }
        }
        return Some((runner, args, env));
    }
    None
}

/// A script with the scripts it calls (`npm run test-cov`, `yarn unit`, `npm test`) put in
/// their place, a few levels deep: `"test": "npm run lint && npm run test-cov"` runs mocha
/// where `test-cov` says how.
fn expand_scripts(doc: &Value, script: &str, depth: usize) -> String {
    if depth > 3 {
        return script.to_string();
    }
    let mut out = Vec::new();
    for segment in script.split("&&") {
        let words = shell_words(segment);
        let name = match words.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["npm" | "pnpm", "run" | "run-script", name, ..] | ["yarn", "run", name, ..] => Some(name.to_string()),
            ["npm" | "pnpm" | "yarn", "test" | "t"] => Some("test".to_string()),
            ["yarn", name, ..] if !["install", "add", "build"].contains(name) => Some(name.to_string()),
            _ => None,
        };
        match name.and_then(|n| doc.pointer(&format!("/scripts/{}", n.replace('~', "~0").replace('/', "~1")))) {
            Some(Value::String(inner)) => out.push(expand_scripts(doc, inner, depth + 1)),
            _ => out.push(segment.trim().to_string()),
        }
    }
    out.join(" && ")
}

/// Words of a shell command, with simple quotes removed (no expansion).
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() || any {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if !cur.is_empty() || any {
        out.push(cur);
    }
    out
}

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

    fn major(&self) -> &str {
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

/// How to run a PR's tests in a node environment (per PR: the script's options may differ
/// between PRs that share an environment).
#[derive(Debug, Clone)]
pub struct NodeRun {
    pub runner: Runner,
    pub args: Vec<String>,
    pub script_env: Vec<(String, String)>,
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
    tools: &Tools,
    sandbox: &sandbox::Sandbox,
) -> std::result::Result<Env, Box<EnvRow>> {
    let started = Instant::now();
    let language = if spec.typescript { "typescript" } else { "javascript" };
    let mut row = EnvRow::new(repo, language, String::new(), &spec.files, spec.requirements.clone(), as_of);
    let node = match &tools.node {
        Ok(n) => n,
        Err(why) => return row.failed(why),
    };
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
            Ok(Env {
                key,
                venv: dir,
                row,
                node: Some(NodeRun {
                    runner: spec.runner,
                    args: spec.runner_args.clone(),
                    script_env: spec.script_env.clone(),
                }),
            })
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
    std::fs::write(&cached, &lock)?;
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
    let ready = dir.join(".swelake-ready");
    let fresh = !ready.is_file();
    if fresh {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("package.json"), &spec.package_json)?;
        std::fs::write(dir.join("package-lock.json"), lock)?;
        let mut cmd = node.npm(&tools.root, &dir);
        cmd.args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--include=dev"]);
        if legacy_peers {
            cmd.arg("--legacy-peer-deps");
        }
        let out = cmd.output().context("running npm ci")?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            bail!("npm ci: {}", npm_error(&String::from_utf8_lossy(&out.stderr)));
        }
    }
    // The runner must start here, in the sandbox, before any PR is judged by it.
    let scratch = tempfile::Builder::new().prefix("probe-").tempdir_in(&tools.root)?;
    let log = scratch.path().join("probe.log");
    let bin = dir.join("node_modules/.bin").join(spec.runner.name());
    let argv = vec![node.node.to_string_lossy().to_string(), bin.to_string_lossy().to_string(), "--version".into()];
    let exit = sandbox_for(sandbox).run(
        &argv,
        scratch.path(),
        &base_env(node, &dir, sandbox.memory_mb),
        &mounts(node, &dir, scratch.path(), None),
        &log,
        Duration::from_secs(60),
    )?;
    if exit.code != Some(0) {
        let _ = std::fs::remove_file(&ready);
        bail!("{} does not start on node {}: {}", spec.runner.name(), node.version, one_line(&sandbox::tail(&log, 4)));
    }
    std::fs::write(&ready, "")?;
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
fn sandbox_for(sandbox: &sandbox::Sandbox) -> sandbox::Sandbox {
    let mut s = sandbox.clone();
    s.memory_mb = s.memory_mb.max(64 << 10);
    s
}

fn base_env(node: &NodeTools, dir: &Path, memory_mb: u64) -> Vec<(String, String)> {
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

fn mounts(node: &NodeTools, env_dir: &Path, writable: &Path, reporter: Option<&Path>) -> sandbox::Mounts {
    let mut read_only = vec![env_dir.to_path_buf()];
    read_only.extend(node.prefix.clone());
    read_only.extend(reporter.map(Path::to_path_buf));
    sandbox::Mounts { read_only, writable: vec![writable.to_path_buf()], ..Default::default() }
}

/// A JavaScript or TypeScript file a runner can be pointed at: not a fixture, mock or snapshot.
pub fn is_test_file(path: &str) -> bool {
    const EXT: &[&str] = &[".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts"];
    let helper = ["fixtures/", "__fixtures__/", "__mocks__/", "__snapshots__/", "node_modules/"];
    EXT.iter().any(|e| path.ends_with(e)) && !path.ends_with(".d.ts") && !helper.iter().any(|h| path.contains(h))
}

/// The mocha reporter: one record per test, to the file named by `SWELAKE_REPORT`.
const MOCHA_REPORTER: &str = r#"'use strict';
// swelake's mocha reporter: one JSON record per test, written to the file named by
// SWELAKE_REPORT when the run ends (stdout is the tests' own, console.log included).
var fs = require('fs');
function titles(t) {
  var out = [];
  for (var s = t; s; s = s.parent) { if (s.title) out.unshift(s.title); }
  return out;
}
function fileOf(t) {
  for (var s = t; s; s = s.parent) { if (s.file) return s.file; }
  return '';
}
function Reporter(runner) {
  var tests = [];
  var add = function (t, state) {
    tests.push({ file: fileOf(t), titles: titles(t), state: state, duration: t.duration || 0 });
  };
  runner.on('pass', function (t) { add(t, 'passed'); });
  runner.on('fail', function (t) { if (t.type !== 'hook') add(t, 'failed'); });
  runner.on('pending', function (t) { add(t, 'skipped'); });
  runner.on('end', function () {
    fs.writeFileSync(process.env.SWELAKE_REPORT, JSON.stringify({ tests: tests }));
  });
}
module.exports = Reporter;
"#;

/// Runs the runner on `files` (the whole suite when empty) in `tree`, in the sandbox.
#[allow(clippy::too_many_arguments)]
pub fn run_tests(
    tree: &Path,
    side_dir: &Path,
    label: &str,
    files: &[String],
    env: &Env,
    run: &NodeRun,
    tools: &Tools,
    sandbox: &sandbox::Sandbox,
    cfg: &VerifyConfig,
) -> Result<RunOutcome> {
    let node = tools.node.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    let out = side_dir.join("out");
    std::fs::create_dir_all(&out)?;
    let report = out.join(format!("{label}.json"));
    let log = out.join(format!("{label}.log"));
    let _ = std::fs::remove_file(&report);
    let link = tree.join("node_modules");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(env.venv.join("node_modules"), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    let bin = env.venv.join("node_modules/.bin").join(run.runner.name());
    let mut argv = vec![node.node.to_string_lossy().to_string(), bin.to_string_lossy().to_string()];
    let mut envs = base_env(node, &env.venv, sandbox.memory_mb);
    for (k, v) in &run.script_env {
        match envs.iter_mut().find(|(name, _)| name == k) {
            // The script's node options (`--experimental-vm-modules` for jest on ESM) join ours.
            Some((_, ours)) if k == "NODE_OPTIONS" => *ours = format!("{ours} {v}"),
            _ => envs.push((k.clone(), v.clone())),
        }
    }
    let mut reporter = None;
    let report_s = report.to_string_lossy().to_string();
    match run.runner {
        Runner::Jest => {
            argv.extend(run.args.iter().cloned());
            argv.extend(["--ci", "--runInBand", "--json", &format!("--outputFile={report_s}")].map(String::from));
            if !cfg.whole_suite && !files.is_empty() {
                argv.push("--runTestsByPath".into());
            }
        }
        Runner::Vitest => {
            argv.push("run".into());
            argv.extend(run.args.iter().cloned());
            argv.extend(["--reporter=json", &format!("--outputFile={report_s}")].map(String::from));
        }
        Runner::Mocha => {
            let path = tools.root.join("tools").join("swelake-mocha-reporter.js");
            if std::fs::read_to_string(&path).ok().as_deref() != Some(MOCHA_REPORTER) {
                std::fs::create_dir_all(path.parent().expect("under tools"))?;
                std::fs::write(&path, MOCHA_REPORTER)?;
            }
            argv.extend(run.args.iter().cloned());
            argv.extend(["--reporter".to_string(), path.to_string_lossy().to_string()]);
            envs.push(("SWELAKE_REPORT".into(), report_s.clone()));
            reporter = Some(path);
        }
    }
    if !cfg.whole_suite {
        argv.extend(files.iter().cloned());
    }
    let exit = sandbox_for(sandbox).run(
        &argv,
        tree,
        &envs,
        &mounts(node, &env.venv, side_dir, reporter.as_deref()),
        &log,
        Duration::from_secs(cfg.timeout_secs),
    )?;
    let tail = without_stack_frames(&super::runner::without_durations(&sandbox::tail(&log, 40)));
    if exit.timed_out {
        return Ok(RunOutcome::TimedOut(tail));
    }
    // The report is the run's own file: read without following a link it may have left.
    let tests = match sandbox::read_output(&report, side_dir, 256 << 20) {
        Ok(text) => match run.runner {
            Runner::Mocha => super::outcomes::parse_mocha(&text, tree)?,
            Runner::Jest | Runner::Vitest => super::outcomes::parse_jest(&text, tree)?,
        },
        Err(_) => return Ok(RunOutcome::NoReport(exit.code, tail)),
    };
    Ok(RunOutcome::Report(tests, tail))
}

/// A node log's last lines without the stack frames (`    at Module.require (…)`), so the
/// error they follow is what a reason shows.
fn without_stack_frames(text: &str) -> String {
    let lines: Vec<&str> =
        text.lines().filter(|l| !l.trim_start().starts_with("at ") && !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(map: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |p| map.iter().find(|(k, _)| *k == p).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_runner_and_its_options_come_from_the_test_script() {
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"name":"x","version":"2.1.0","scripts":{"test":"cross-env NODE_ENV=test mocha -r ts-node/register --timeout 5000 --reporter dot 'test/**/*.spec.ts' && eslint ."},
               "devDependencies":{"mocha":"^10.0.0","ts-node":"^10"}}"#,
        )]))
        .unwrap();
        assert_eq!(spec.runner, Runner::Mocha);
        assert_eq!(spec.runner_args, ["-r", "ts-node/register", "--timeout", "5000"]);
        assert_eq!(spec.script_env, [("NODE_ENV".to_string(), "test".to_string())]);
        assert_eq!(spec.requirements, ["mocha@^10.0.0", "ts-node@^10"]);
        assert_eq!(spec.version.as_deref(), Some("2.1.0"));
        // No runner in the script: the dependencies say which.
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"scripts":{"test":"npm run build && node scripts/test.js"},"devDependencies":{"jest":"29"}}"#,
        )]))
        .unwrap();
        assert_eq!(spec.runner, Runner::Jest);
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"scripts":{"test":"vitest run --globals --coverage"},"devDependencies":{"vitest":"1"}}"#,
        )]))
        .unwrap();
        assert_eq!((spec.runner, spec.runner_args), (Runner::Vitest, vec!["--globals".to_string()]));
        // The test script calls another script: that one says how mocha runs.
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"scripts":{"lint":"standard","test-cov":"istanbul cover node_modules/mocha/bin/_mocha -- --require ts-node/register -R spec test.ts","test":"npm run lint && npm run test-cov"},
               "devDependencies":{"mocha":"~2.2.4","istanbul":"~0.3.0"}}"#,
        )]))
        .unwrap();
        assert_eq!(
            (spec.runner, spec.runner_args),
            (Runner::Mocha, vec!["--require".into(), "ts-node/register".into()])
        );
        let err = read_spec(&files(&[("package.json", r#"{"scripts":{"test":"tap test/*.js"}}"#)])).unwrap_err();
        assert!(err.contains("tap test/*.js"), "{err}");
        assert!(read_spec(&files(&[("package.json", r#"{"workspaces":["a"]}"#)])).unwrap_err().contains("workspaces"));
    }

    #[test]
    fn test_files_leave_fixtures_out() {
        assert!(is_test_file("test/calc.test.js") && is_test_file("src/__tests__/a.spec.tsx"));
        assert!(!is_test_file("test/fixtures/broken.js") && !is_test_file("test/__snapshots__/a.js.snap"));
        assert!(!is_test_file("types/index.d.ts") && !is_test_file("test/data.json"));
    }
}
