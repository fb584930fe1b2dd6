//! JavaScript and TypeScript: what `package.json` declares (its dependencies, the test runner
//! its `test` script calls — jest, vitest, mocha, ava, `node --test`, tap or tape, jasmine —
//! that script's options, the build steps it runs before the tests and the lint steps it runs
//! around them), resolved by npm as of the PR's day ([`mod@env`]) and run in the sandbox with
//! per-test outcomes from each runner's machine format ([`run`]).

pub mod env;
pub mod run;

use std::collections::BTreeSet;

use serde_json::Value;

use super::sandbox::Sandbox;
use super::toolchain::{one_line, EnvStop, Prepared, Status, Toolchain, Tools};
use super::PrRef;

/// The JavaScript/TypeScript toolchain (node and npm of this machine).
pub struct JavaScript;

impl Toolchain for JavaScript {
    fn name(&self) -> &'static str {
        "javascript"
    }

    fn project_files(&self) -> &'static [&'static str] {
        &["package.json"]
    }

    fn test_file_kinds(&self) -> &'static str {
        "*.js, *.ts outside fixtures"
    }

    fn prepare(
        &self,
        read: &dyn Fn(&str) -> Option<String>,
        pr: &PrRef,
        tools: &Tools,
        sandbox: &Sandbox,
    ) -> std::result::Result<Prepared, EnvStop> {
        let spec = read_spec(read).map_err(|why| EnvStop::new(Status::ToolchainUnavailable, why, &None))?;
        let node = tools.kit("javascript", |_| env::NodeTools::probe());
        let node = match node.as_ref() {
            Ok(n) => n,
            Err(why) => return Err(EnvStop::new(Status::ToolchainUnavailable, why.clone(), &spec.version)),
        };
        match env::prepare(&pr.repo_name, &spec, &pr.merged_at, node, tools, sandbox) {
            Ok(env) => Ok(Prepared { env, version: spec.version.unwrap_or_default() }),
            Err(row) => Err(EnvStop::failed(row, &pr.merged_at, spec.version)),
        }
    }
}

/// The test runners whose results can be read per test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    Jest,
    Vitest,
    Mocha,
    Ava,
    /// Node's own runner (`node --test`, node 18 and later).
    NodeTest,
    /// node-tap and tape: each test file is a program that writes TAP.
    Tap,
    Jasmine,
}

impl Runner {
    pub fn name(self) -> &'static str {
        match self {
            Runner::Jest => "jest",
            Runner::Vitest => "vitest",
            Runner::Mocha => "mocha",
            Runner::Ava => "ava",
            Runner::NodeTest => "node --test",
            Runner::Tap => "tap",
            Runner::Jasmine => "jasmine",
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
            Runner::Ava => &[("--config", true), ("--node-arguments", true), ("--timeout", true), ("-T", true)],
            // Node's options before `--test`: loaders and flags a TypeScript suite needs.
            Runner::NodeTest => &[
                ("--import", true),
                ("--loader", true),
                ("--experimental-loader", true),
                ("--require", true),
                ("-r", true),
                ("--experimental-strip-types", false),
                ("--experimental-test-module-mocks", false),
                ("--experimental-vm-modules", false),
                ("--no-warnings", false),
                ("--enable-source-maps", false),
            ],
            Runner::Tap => &[],
            Runner::Jasmine => &[("--config", true), ("--helper", true), ("--require", true)],
        }
    }

    /// The names a script calls it by (`node_modules/.bin` entries).
    fn commands(self) -> &'static [&'static str] {
        match self {
            Runner::Jest => &["jest", "jest-cli"],
            Runner::Vitest => &["vitest"],
            Runner::Mocha => &["mocha", "_mocha"],
            Runner::Ava => &["ava"],
            Runner::NodeTest => &[],
            Runner::Tap => &["tap", "tape"],
            Runner::Jasmine => &["jasmine"],
        }
    }

    /// The arguments that make it say its version: a probe that it starts in the sandbox.
    pub fn version_args(self) -> &'static [&'static str] {
        match self {
            Runner::Jasmine => &["-v"],
            _ => &["--version"],
        }
    }
}

/// Runners found by name in a script or in the dependencies, in the order they are tried.
const RUNNERS: [Runner; 6] = [Runner::Vitest, Runner::Jest, Runner::Mocha, Runner::Ava, Runner::Jasmine, Runner::Tap];

/// Steps of a `test` script that check style or types, not behaviour: skipped (and said in
/// `environments.relaxed`).
const LINTERS: &[&str] = &[
    "xo",
    "eslint",
    "tsd",
    "standard",
    "semistandard",
    "prettier",
    "tslint",
    "biome",
    "jshint",
    "jscs",
    "dtslint",
    "attw",
    "publint",
    "lint-staged",
    "markdownlint",
    "stylelint",
    "type-coverage",
    "npmPkgJsonLint",
];

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
    /// Steps the `test` script runs before its runner that are not lint (`tsc`, `npm run
    /// build` as its script says): run in the sandbox in each side's tree before the tests.
    pub build_steps: Vec<String>,
    /// Lint steps of the script, skipped.
    pub lint_steps: Vec<String>,
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
    let expanded = expand_scripts(&doc, &script, 0);
    let from_script = script_runner(&expanded);
    let runner = match from_script {
        Some((r, _, _)) => r,
        None => RUNNERS.into_iter().find(|r| r.commands().iter().any(|c| deps.contains(*c))).ok_or_else(|| {
            format!(
                "no test runner that reports per test (jest, vitest, mocha, ava, node --test, tap, tape, jasmine) \
                 in package.json (test script: `{}`)",
                one_line(&script)
            )
        })?,
    };
    // Steps around the runner are read only where the script calls it.
    let (build_steps, lint_steps) = if from_script.is_some() { steps_around(&expanded) } else { Default::default() };
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
        build_steps,
        lint_steps,
    })
}

/// `NAME=value` pairs.
type Vars = Vec<(String, String)>;

/// The runner a `test` script calls, the options it passes that are kept, and the variables it
/// sets in front (`NODE_ENV=test mocha -r ts-node/register 'test/**/*.ts' && eslint .`).
fn script_runner(script: &str) -> Option<(Runner, Vec<String>, Vars)> {
    for segment in script.split(['&', ';', '|']) {
        let words = shell_words(segment);
        if let Some(found) = node_test(&words) {
            return Some(found);
        }
        let at = words.iter().position(|w| {
            let base = w.rsplit('/').next().unwrap_or(w);
            RUNNERS.iter().any(|r| r.commands().contains(&base))
        });
        let Some(at) = at else { continue };
        let base = words[at].rsplit('/').next().unwrap_or(&words[at]).to_string();
        let runner = RUNNERS.into_iter().find(|r| r.commands().contains(&base.as_str()))?;
        let env = leading_vars(&words[..at]);
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

/// `node [options] --test [files]`: node's own runner, with the options before `--test` that
/// are kept and the variables set in front.
fn node_test(words: &[String]) -> Option<(Runner, Vec<String>, Vars)> {
    let at = words.iter().position(|w| w.rsplit('/').next() == Some("node"))?;
    let test = words[at + 1..].iter().position(|w| w == "--test")? + at + 1;
    let kept = Runner::NodeTest.kept_options();
    let mut args = Vec::new();
    let mut rest = words[at + 1..test].iter();
    while let Some(w) = rest.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (w.as_str(), None),
        };
        match kept.iter().find(|(f, _)| *f == flag) {
            Some((_, true)) => match inline {
                Some(v) => args.push(format!("{flag}={v}")),
                None => {
                    if let Some(v) = rest.next() {
                        args.push(format!("{flag}={v}"));
                    }
                }
            },
            Some((_, false)) => args.push(w.clone()),
            None => {}
        }
    }
    Some((Runner::NodeTest, args, leading_vars(&words[..at])))
}

/// `NAME=value` words in front of a command (`cross-env` and `env` pass through).
fn leading_vars(words: &[String]) -> Vars {
    words
        .iter()
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .filter(|(k, _)| !["PATH", "HOME"].contains(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Whether a script segment calls a test runner.
fn calls_runner(segment: &str) -> bool {
    let words = shell_words(segment);
    node_test(&words).is_some()
        || words.iter().any(|w| {
            let base = w.rsplit('/').next().unwrap_or(w);
            RUNNERS.iter().any(|r| r.commands().contains(&base))
        })
}

/// The steps of an expanded `test` script before its runner's: (build steps, lint steps). A
/// lint step is one whose command is a linter or type checker of [`LINTERS`]; steps after the
/// runner are left out.
fn steps_around(expanded: &str) -> (Vec<String>, Vec<String>) {
    let (mut build, mut lint) = (Vec::new(), Vec::new());
    for segment in expanded.split("&&").flat_map(|s| s.split(';')).map(str::trim).filter(|s| !s.is_empty()) {
        let words = shell_words(segment);
        let command = words
            .iter()
            .find(|w| !w.contains('=') && !["cross-env", "env", "npx"].contains(&w.as_str()))
            .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
            .unwrap_or_default();
        if LINTERS.contains(&command.as_str()) {
            lint.push(segment.to_string());
        } else if calls_runner(segment) {
            break;
        } else {
            build.push(segment.to_string());
        }
    }
    (build, lint)
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
        assert!(read_spec(&files(&[("package.json", r#"{"workspaces":["a"]}"#)])).unwrap_err().contains("workspaces"));
    }

    #[test]
    fn ava_node_test_tap_and_jasmine_with_build_and_lint_steps() {
        // ava behind a linter and a build: the build runs first, the linter is skipped.
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"scripts":{"build":"del-cli dist && tsc","test":"xo && npm run build && ava --timeout=1m","pretest":"x"},
               "devDependencies":{"ava":"^6","xo":"^0.58","typescript":"^5"}}"#,
        )]))
        .unwrap();
        assert_eq!(spec.runner, Runner::Ava);
        assert_eq!(spec.runner_args, ["--timeout=1m"]);
        assert_eq!(spec.build_steps, ["del-cli dist", "tsc"]);
        assert_eq!(spec.lint_steps, ["xo"]);
        // node's own runner, with the loader its TypeScript tests need.
        let spec = read_spec(&files(&[(
            "package.json",
            r#"{"scripts":{"test":"NODE_ENV=test node --import tsx --no-warnings --test test/*.test.ts && tsd"}}"#,
        )]))
        .unwrap();
        assert_eq!(spec.runner, Runner::NodeTest);
        assert_eq!(spec.runner_args, ["--import=tsx", "--no-warnings"]);
        assert_eq!(spec.script_env, [("NODE_ENV".to_string(), "test".to_string())]);
        assert!(spec.build_steps.is_empty() && spec.lint_steps.is_empty());
        let spec = read_spec(&files(&[("package.json", r#"{"scripts":{"test":"tap test/*.js"}}"#)])).unwrap();
        assert_eq!(spec.runner, Runner::Tap);
        let spec =
            read_spec(&files(&[("package.json", r#"{"scripts":{"test":"tape test/*.js | tap-spec"}}"#)])).unwrap();
        assert_eq!(spec.runner, Runner::Tap);
        let spec =
            read_spec(&files(&[("package.json", r#"{"scripts":{"test":"jasmine --config=spec/j.json"}}"#)])).unwrap();
        assert_eq!((spec.runner, spec.runner_args), (Runner::Jasmine, vec!["--config=spec/j.json".to_string()]));
        let err = read_spec(&files(&[("package.json", r#"{"scripts":{"test":"make check"}}"#)])).unwrap_err();
        assert!(err.contains("make check"), "{err}");
    }
}
