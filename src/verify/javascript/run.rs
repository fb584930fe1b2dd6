//! How a JavaScript or TypeScript PR's tests run: the `test` script's build steps once per
//! side, then its runner on the PR's test files in the sandbox, per-test outcomes read from
//! the runner's machine format ([`crate::verify::outcomes`]): jest's and vitest's `--json`
//! reports (the same shape); for mocha, jasmine and `node --test`, reporters of our own that
//! write one JSON record per test to a file (their own formats write to stdout, where the
//! tests' output lands too); TAP for ava (`--tap`, one file per run, so each test's file is
//! known) and for tap and tape files (each is a program that writes TAP when node runs it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::env::{base_env, mounts, sandbox_for, NodeTools};
use super::Runner;
use crate::verify::outcomes::{self, TestResult};
use crate::verify::sandbox;
use crate::verify::toolchain::{Missing, RunCtx, RunOutcome, Side, TestRunner};

/// A PR's tests in a node environment (per PR: the script's options may differ between PRs
/// that share an environment).
#[derive(Debug, Clone)]
pub struct NodeRunner {
    pub node: NodeTools,
    /// The environment: its `node_modules`.
    pub dir: PathBuf,
    pub runner: Runner,
    pub args: Vec<String>,
    pub script_env: Vec<(String, String)>,
    pub build_steps: Vec<String>,
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

/// The reporter of `node --test` (node 18.15 and later take a module): the same records as
/// mocha's, written by node to `--test-reporter-destination` at the end. A test's describe
/// blocks come from the `test:start` events, which arrive in order within a file; suites and
/// a file's own entry (a file that does not load) are not tests.
const NODE_TEST_REPORTER: &str = r#"// swelake's reporter for node --test: one JSON record per test.
export default async function* swelakeReporter(source) {
  const tests = [];
  const stacks = new Map();
  for await (const ev of source) {
    const d = ev.data || {};
    if (ev.type === 'test:start') {
      const s = stacks.get(d.file) || [];
      s.length = d.nesting;
      s.push(d.name);
      stacks.set(d.file, s);
    } else if (ev.type === 'test:pass' || ev.type === 'test:fail') {
      if ((d.details && d.details.type === 'suite') || d.name === d.file) continue;
      const s = (stacks.get(d.file) || []).slice(0, d.nesting);
      let state = ev.type === 'test:pass' ? 'passed' : 'failed';
      if (d.skip || d.todo) state = 'skipped';
      const duration = (d.details && d.details.duration_ms) || 0;
      tests.push({ file: d.file || '', titles: s.concat([d.name]), state, duration });
    }
  }
  yield JSON.stringify({ tests });
}
"#;

/// The jasmine reporter (`--reporter=<file>`, jasmine 3.6 and later): the same records.
const JASMINE_REPORTER: &str = r#"'use strict';
// swelake's jasmine reporter: one JSON record per spec, to the file named by SWELAKE_REPORT.
var fs = require('fs');
function Reporter() {
  var tests = [], suites = [];
  this.suiteStarted = function (r) { suites.push(r.description); };
  this.suiteDone = function () { suites.pop(); };
  this.specDone = function (r) {
    var st = r.status === 'passed' ? 'passed' : r.status === 'failed' ? 'failed' : 'skipped';
    tests.push({ file: r.filename || '', titles: suites.concat([r.description]), state: st, duration: r.duration || 0 });
  };
  this.jasmineDone = function () { fs.writeFileSync(process.env.SWELAKE_REPORT, JSON.stringify({ tests: tests })); };
}
module.exports = Reporter;
"#;

/// A reporter's file under the tools directory (written once, read-only in the sandbox).
fn reporter_file(root: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = root.join("tools").join(name);
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
        std::fs::create_dir_all(path.parent().expect("under tools"))?;
        let part = path.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&part, text)?;
        std::fs::rename(&part, &path)?;
    }
    Ok(path)
}

/// A shell that runs its arguments with stdout sent to `$SWELAKE_REPORT` (TAP runners write
/// their report there; what the tests print to stderr stays in the log).
fn to_report(argv: Vec<String>) -> Vec<String> {
    let mut v = vec!["/bin/sh".to_string(), "-c".into(), "exec \"$0\" \"$@\" > \"$SWELAKE_REPORT\"".into()];
    v.extend(argv);
    v
}

impl NodeRunner {
    fn env(&self, ctx: &RunCtx<'_>) -> Vec<(String, String)> {
        let mut envs = base_env(&self.node, &self.dir, ctx.sandbox.memory_mb);
        for (k, v) in &self.script_env {
            match envs.iter_mut().find(|(name, _)| name == k) {
                // The script's node options (`--experimental-vm-modules` for jest on ESM) join ours.
                Some((_, ours)) if k == "NODE_OPTIONS" => *ours = format!("{ours} {v}"),
                _ => envs.push((k.clone(), v.clone())),
            }
        }
        envs
    }

    fn link_modules(&self, tree: &Path) -> Result<()> {
        let link = tree.join("node_modules");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(self.dir.join("node_modules"), &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
        Ok(())
    }

    fn bin(&self) -> String {
        self.dir.join("node_modules/.bin").join(self.runner.commands()[0]).to_string_lossy().to_string()
    }

    /// One invocation: (exit, report text or None, log tail).
    fn invoke(
        &self,
        ctx: &RunCtx<'_>,
        argv: &[String],
        extra_env: &[(String, String)],
        reporter: Option<&Path>,
        label: &str,
        limit: Duration,
    ) -> Result<(sandbox::Exit, Option<String>, String)> {
        let out = ctx.side_dir.join("out");
        std::fs::create_dir_all(&out)?;
        let report = out.join(format!("{label}.json"));
        let log = out.join(format!("{label}.log"));
        let _ = std::fs::remove_file(&report);
        let mut envs = self.env(ctx);
        envs.push(("SWELAKE_REPORT".into(), report.to_string_lossy().to_string()));
        envs.extend(extra_env.iter().cloned());
        let exit = sandbox_for(ctx.sandbox).run(
            argv,
            ctx.tree,
            &envs,
            &mounts(&self.node, &self.dir, ctx.side_dir, reporter),
            &log,
            limit,
        )?;
        let tail = without_stack_frames(&crate::verify::runner::without_durations(&sandbox::tail(&log, 40)));
        // The report is the run's own file: read without following a link it may have left.
        let text = sandbox::read_output(&report, ctx.side_dir, 256 << 20).ok();
        Ok((exit, text, tail))
    }
}

impl TestRunner for NodeRunner {
    fn name(&self) -> &'static str {
        self.runner.name()
    }

    /// The `test` script's build steps (`tsc`, `npm run build`'s commands), in the sandbox in
    /// the side's tree. A step that fails is left in the log and the tests run all the same:
    /// before the fix a build that type-checks the PR's new tests fails as their import
    /// would, and what the tests then report is the verdict.
    fn before_runs(&self, ctx: &RunCtx<'_>) -> std::result::Result<(), String> {
        self.link_modules(ctx.tree).map_err(|e| format!("{e:#}"))?;
        if self.build_steps.is_empty() {
            return Ok(());
        }
        let script = self.build_steps.join(" && ");
        let argv = vec!["/bin/sh".to_string(), "-c".into(), script];
        let log = ctx.side_dir.join("out").join(format!("{}-build.log", ctx.label));
        std::fs::create_dir_all(ctx.side_dir.join("out")).map_err(|e| e.to_string())?;
        let exit = sandbox_for(ctx.sandbox)
            .run(
                &argv,
                ctx.tree,
                &self.env(ctx),
                &mounts(&self.node, &self.dir, ctx.side_dir, None),
                &log,
                Duration::from_secs(ctx.cfg.timeout_secs),
            )
            .map_err(|e| format!("{e:#}"))?;
        if exit.timed_out {
            return Err(format!(
                "the build step `{}` passed the {} s limit",
                self.build_steps.join(" && "),
                ctx.cfg.timeout_secs
            ));
        }
        Ok(())
    }

    fn run(&self, ctx: &RunCtx<'_>, files: &[String]) -> Result<RunOutcome> {
        self.link_modules(ctx.tree)?;
        let files: &[String] = if ctx.cfg.whole_suite { &[] } else { files };
        let node = self.node.node.to_string_lossy().to_string();
        let limit = Duration::from_secs(ctx.cfg.timeout_secs);
        let report_of =
            |label: &str| ctx.side_dir.join("out").join(format!("{label}.json")).to_string_lossy().to_string();
        let (argv, reporter): (Vec<String>, Option<PathBuf>) = match self.runner {
            Runner::Ava | Runner::Tap => return self.run_tap(ctx, files),
            Runner::Jest => {
                let mut argv = vec![node, self.bin()];
                argv.extend(self.args.iter().cloned());
                argv.extend(
                    ["--ci", "--runInBand", "--json", &format!("--outputFile={}", report_of(ctx.label))]
                        .map(String::from),
                );
                if !files.is_empty() {
                    argv.push("--runTestsByPath".into());
                }
                (argv, None)
            }
            Runner::Vitest => {
                let mut argv = vec![node, self.bin(), "run".into()];
                argv.extend(self.args.iter().cloned());
                argv.extend(["--reporter=json".to_string(), format!("--outputFile={}", report_of(ctx.label))]);
                (argv, None)
            }
            Runner::Mocha => {
                let path = reporter_file(&ctx.tools.root, "swelake-mocha-reporter.js", MOCHA_REPORTER)?;
                let mut argv = vec![node, self.bin()];
                argv.extend(self.args.iter().cloned());
                argv.extend(["--reporter".to_string(), path.to_string_lossy().to_string()]);
                (argv, Some(path))
            }
            Runner::Jasmine => {
                let path = reporter_file(&ctx.tools.root, "swelake-jasmine-reporter.js", JASMINE_REPORTER)?;
                let mut argv = vec![node, self.bin()];
                argv.extend(self.args.iter().cloned());
                argv.push(format!("--reporter={}", path.display()));
                (argv, Some(path))
            }
            Runner::NodeTest => {
                let path = reporter_file(&ctx.tools.root, "swelake-node-test-reporter.mjs", NODE_TEST_REPORTER)?;
                let mut argv = vec![node];
                argv.extend(self.args.iter().cloned());
                argv.extend([
                    "--test".to_string(),
                    format!("--test-reporter={}", path.display()),
                    format!("--test-reporter-destination={}", report_of(ctx.label)),
                ]);
                (argv, Some(path))
            }
        };
        let mut argv = argv;
        argv.extend(files.iter().cloned());
        let (exit, text, tail) = self.invoke(ctx, &argv, &[], reporter.as_deref(), ctx.label, limit)?;
        if exit.timed_out {
            return Ok(RunOutcome::TimedOut(tail));
        }
        let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
            return Ok(RunOutcome::NoReport(exit.code, tail));
        };
        let tests = match self.runner {
            Runner::Jest | Runner::Vitest => outcomes::parse_jest(&text, ctx.tree)?,
            _ => outcomes::parse_mocha(&text, ctx.tree)?,
        };
        Ok(RunOutcome::Report(tests, tail))
    }

    fn missing_report(&self, side: Side, code: Option<i32>) -> Missing {
        match (self.runner, side, code) {
            // A test file that does not load before the fix (it requires what the fix adds)
            // stops mocha before any report, with its exit status 1: its tests are absent
            // there. A crash (a signal, V8 out of memory) is not that.
            (Runner::Mocha, Side::Before, Some(1)) => Missing::Absent,
            _ => Missing::Failed,
        }
    }

    fn error_line(&self, tail: &str) -> String {
        tail.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string()
    }
}

impl NodeRunner {
    /// ava (`--tap`) and tap/tape files (`node FILE`), one file per invocation so each test's
    /// file is known; the time limit holds for all of them together.
    fn run_tap(&self, ctx: &RunCtx<'_>, files: &[String]) -> Result<RunOutcome> {
        let started = Instant::now();
        let limit = Duration::from_secs(ctx.cfg.timeout_secs);
        let node = self.node.node.to_string_lossy().to_string();
        let mut all: Vec<TestResult> = Vec::new();
        let mut tail = String::new();
        let mut any_report = false;
        let mut last_code = None;
        let targets: Vec<Option<&String>> =
            if files.is_empty() { vec![None] } else { files.iter().map(Some).collect() };
        for (k, file) in targets.iter().enumerate() {
            let left = limit.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
            let mut argv = vec![node.clone()];
            match self.runner {
                Runner::Ava => {
                    argv.push(self.bin());
                    argv.push("--tap".into());
                    argv.extend(self.args.iter().cloned());
                }
                _ => argv.extend(self.args.iter().cloned()),
            }
            match file {
                Some(f) => argv.push((*f).clone()),
                // tap and tape need their files; the whole suite is ava's own to find.
                None if self.runner == Runner::Tap => {
                    return Ok(RunOutcome::NoReport(None, "no test file given".into()))
                }
                None => {}
            }
            let label = format!("{}-{k}", ctx.label);
            let (exit, text, t) = self.invoke(ctx, &to_report(argv), &[], None, &label, left)?;
            tail = t;
            last_code = exit.code;
            if exit.timed_out {
                return Ok(RunOutcome::TimedOut(tail));
            }
            if let Some(text) = text {
                any_report = true;
                let prefix = file.map(|f| f.as_str()).unwrap_or(self.runner.name());
                all.extend(outcomes::parse_tap(&text, prefix));
            }
        }
        if !any_report {
            return Ok(RunOutcome::NoReport(last_code, tail));
        }
        Ok(RunOutcome::Report(all, tail))
    }
}

/// A node log's last lines without the stack frames (`    at Module.require (…)`), so the
/// error they follow is what a reason shows.
fn without_stack_frames(text: &str) -> String {
    let lines: Vec<&str> =
        text.lines().filter(|l| !l.trim_start().starts_with("at ") && !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}
