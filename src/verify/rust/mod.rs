//! Rust: a tree with a `Cargo.toml` at its root (a package, or a workspace and its members),
//! its dependency graph as the committed `Cargo.lock` states it (else resolved once, as of the
//! day it was first asked), vendored outside the sandbox by `cargo vendor` — which downloads
//! and runs no crate's code — and every build and test run inside it, offline, since `build.rs`
//! files and proc macros are the crates' own code ([`mod@env`]). One target directory per
//! dependency graph, reused by every PR of that lock. A side's runs are `cargo test` on the test
//! targets its test files are ([`run`]): `tests/x.rs` by `--test x`, a test module of `src/`
//! by its module path as libtest's filter; outcomes per test from libtest's lines, ids
//! `target::path::name`.

pub mod env;
pub mod run;

use std::collections::BTreeSet;

use super::sandbox::Sandbox;
use super::toolchain::{EnvStop, Prepared, Status, Toolchain, Tools};
use super::PrRef;

/// The Rust toolchain (the host's cargo and rustc).
pub struct Rust;

impl Toolchain for Rust {
    fn name(&self) -> &'static str {
        "rust"
    }

    fn project_files(&self) -> &'static [&'static str] {
        &["Cargo.toml"]
    }

    fn test_file_kinds(&self) -> &'static str {
        "*.rs under tests/ (integration test targets) or a test module of src/ (tests.rs)"
    }

    fn prepare(
        &self,
        read: &dyn Fn(&str) -> Option<String>,
        pr: &PrRef,
        tools: &Tools,
        sandbox: &Sandbox,
    ) -> std::result::Result<Prepared, EnvStop> {
        let spec = read_spec(read).map_err(|why| EnvStop::new(Status::EnvFailed, why, &None))?;
        let kit = tools.kit("rust", |_| env::RustTools::probe());
        let rust = match kit.as_ref() {
            Ok(r) => r,
            Err(why) => return Err(EnvStop::new(Status::ToolchainUnavailable, why.clone(), &spec.version)),
        };
        match env::prepare(&pr.repo_name, &spec, &pr.merged_at, rust, tools, sandbox) {
            Ok(env) => Ok(Prepared { env, version: spec.version.clone().unwrap_or_default() }),
            Err(row) => Err(EnvStop::failed(row, &pr.merged_at, spec.version)),
        }
    }
}

/// A package of the tree: a workspace member, the root package, or a path dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its directory in the tree (`""`: the root).
    pub dir: String,
    pub name: String,
    /// The library's crate name, when it has a library (`[lib] name`, else its name with `_`).
    pub lib: Option<String>,
}

/// What a tree's manifests declare.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrateSpec {
    /// Files read, in order.
    pub files: Vec<String>,
    /// Each manifest's path and text.
    pub manifests: Vec<(String, String)>,
    /// Files a manifest names as a target (`[lib] path`, `[[test]] name`), which must exist for
    /// cargo to read the workspace.
    pub declared_targets: Vec<String>,
    pub members: Vec<Member>,
    /// The committed `Cargo.lock`.
    pub lock: Option<String>,
    /// The dependencies the manifests ask for (`name req`), for `environments.requirements`.
    pub requirements: Vec<String>,
    /// What a `rust-toolchain(.toml)` asks for.
    pub toolchain_file: Option<(String, String)>,
    /// The root package's version.
    pub version: Option<String>,
}

/// Reads the manifests of the tree whose files `read` gives; `Err`: why they cannot be read.
pub fn read_spec(read: &dyn Fn(&str) -> Option<String>) -> std::result::Result<CrateSpec, String> {
    let mut s = CrateSpec::default();
    let root = read("Cargo.toml").ok_or("no Cargo.toml at the merge base")?;
    let root_doc: toml::Table = root.parse().map_err(|e| format!("Cargo.toml does not parse: {e}"))?;
    s.version = root_doc.get("package").and_then(|p| p.get("version")).and_then(|v| v.as_str()).map(str::to_string);
    let mut queue: Vec<String> = vec![String::new()];
    if let Some(ws) = root_doc.get("workspace").and_then(|v| v.as_table()) {
        let excluded: BTreeSet<String> = strings(ws.get("exclude")).into_iter().map(|p| normal(&p)).collect();
        for pattern in strings(ws.get("members")) {
            for dir in expand(&pattern, read) {
                if !excluded.contains(&dir) {
                    queue.push(dir);
                }
            }
        }
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    while let Some(dir) = queue.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let path = join(&dir, "Cargo.toml");
        let Some(text) = (if dir.is_empty() { Some(root.clone()) } else { read(&path) }) else {
            if dir.is_empty() {
                continue;
            }
            return Err(format!("{path} is named by the workspace or a path dependency and is not in the tree"));
        };
        s.files.push(path.clone());
        let doc: toml::Table = text.parse().map_err(|e| format!("{path} does not parse: {e}"))?;
        s.manifests.push((path, text));
        if let Some(pkg) = doc.get("package").and_then(|v| v.as_table()) {
            let name = pkg.get("name").and_then(|v| v.as_str()).unwrap_or_default().to_string();
            let lib_table = doc.get("lib").and_then(|v| v.as_table());
            let lib_path = lib_table.and_then(|l| l.get("path")).and_then(|v| v.as_str());
            if let Some(p) = lib_path {
                s.declared_targets.push(join(&dir, p));
            }
            let has_lib = lib_path.is_some() || read(&join(&dir, "src/lib.rs")).is_some();
            let lib = has_lib.then(|| {
                lib_table
                    .and_then(|l| l.get("name"))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| name.replace('-', "_"))
            });
            for (kind, dflt) in [("bin", "src/bin"), ("test", "tests"), ("bench", "benches"), ("example", "examples")] {
                for t in doc.get(kind).and_then(|v| v.as_array()).into_iter().flatten() {
                    let p = t.get("path").and_then(|v| v.as_str()).map(str::to_string).or_else(|| {
                        t.get("name").and_then(|v| v.as_str()).map(|n| {
                            if kind == "bin" && n == name {
                                "src/main.rs".to_string()
                            } else {
                                format!("{dflt}/{n}.rs")
                            }
                        })
                    });
                    if let Some(p) = p {
                        s.declared_targets.push(join(&dir, &p));
                    }
                }
            }
            s.members.push(Member { dir: dir.clone(), name, lib });
        }
        for (name, spec) in dependencies(&doc) {
            match spec.get("path").and_then(|v| v.as_str()) {
                Some(p) => {
                    let target = normal(&join(&dir, p));
                    if target.starts_with("..") {
                        return Err(format!("{name} is a path dependency outside the tree ({p})"));
                    }
                    queue.push(target);
                }
                None => {
                    let req = spec.as_str().or_else(|| spec.get("version").and_then(|v| v.as_str())).unwrap_or("*");
                    let req = if spec.get("git").is_some() { "git".to_string() } else { req.to_string() };
                    s.requirements.push(format!("{name} {req}"));
                }
            }
        }
    }
    s.members.sort_by(|a, b| a.dir.cmp(&b.dir));
    s.requirements.sort();
    s.requirements.dedup();
    s.lock = read("Cargo.lock");
    if s.lock.is_some() {
        s.files.push("Cargo.lock".into());
    }
    for f in ["rust-toolchain.toml", "rust-toolchain"] {
        if let Some(text) = read(f) {
            s.files.push(f.into());
            let channel = text
                .parse::<toml::Table>()
                .ok()
                .and_then(|d| d.get("toolchain")?.get("channel")?.as_str().map(str::to_string))
                .unwrap_or_else(|| text.trim().to_string());
            s.toolchain_file = Some((f.to_string(), channel));
            break;
        }
    }
    Ok(s)
}

/// Every dependency table of a manifest (normal, dev, build, per target, the workspace's, and
/// `[patch]`), as (name, spec).
fn dependencies(doc: &toml::Table) -> Vec<(String, toml::Value)> {
    let mut tables: Vec<&toml::Table> = Vec::new();
    let kinds = ["dependencies", "dev-dependencies", "dev_dependencies", "build-dependencies", "build_dependencies"];
    for k in kinds {
        tables.extend(doc.get(k).and_then(|v| v.as_table()));
    }
    for t in doc.get("target").and_then(|v| v.as_table()).into_iter().flat_map(|t| t.values()) {
        for k in kinds {
            tables.extend(t.get(k).and_then(|v| v.as_table()));
        }
    }
    tables.extend(doc.get("workspace").and_then(|w| w.get("dependencies")).and_then(|v| v.as_table()));
    tables.extend(
        doc.get("patch").and_then(|v| v.as_table()).into_iter().flat_map(|p| p.values()).filter_map(|v| v.as_table()),
    );
    tables.iter().flat_map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone()))).collect()
}

/// A workspace's `members` entry as directories of the tree: a path, or a path whose last
/// part has a `*` (`crates/*`).
fn expand(pattern: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let pattern = normal(pattern);
    let (parent, last) = match pattern.rsplit_once('/') {
        Some((p, l)) => (p.to_string(), l.to_string()),
        None => (String::new(), pattern.clone()),
    };
    if !last.contains('*') {
        return vec![pattern];
    }
    let listing = read(&if parent.is_empty() { String::new() } else { format!("{parent}/") }).unwrap_or_default();
    let re = regex::Regex::new(&format!("^{}$", regex::escape(&last).replace(r"\*", ".*"))).expect("a valid pattern");
    listing
        .lines()
        .filter_map(|e| e.strip_suffix('/'))
        .filter(|d| re.is_match(d))
        .map(|d| join(&parent, d))
        .filter(|d| read(&join(d, "Cargo.toml")).is_some())
        .collect()
}

fn strings(v: Option<&toml::Value>) -> Vec<String> {
    v.and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn join(dir: &str, path: &str) -> String {
    if dir.is_empty() {
        path.to_string()
    } else {
        format!("{dir}/{path}")
    }
}

/// `a/./b/../c` → `a/c`; a path that climbs out of the tree keeps its leading `..`.
fn normal(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if out.last().is_some_and(|l| *l != "..") => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out.join("/")
}

/// One `cargo test` invocation of a side's run: a package's target and libtest's filters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Invocation {
    pub package: String,
    pub target: Target,
    /// Module paths (`parser::tests::`); empty: every test of the target.
    pub filters: Vec<String>,
}

/// A test target of a package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// The library's unit tests; its crate name.
    Lib(String),
    /// A binary's unit tests.
    Bin(String),
    /// An integration test target (`tests/x.rs`, `tests/x/main.rs`).
    Test(String),
}

impl Target {
    /// The name in a test's id.
    pub fn name(&self) -> &str {
        match self {
            Target::Lib(n) | Target::Bin(n) | Target::Test(n) => n,
        }
    }

    /// cargo's flags selecting it.
    pub fn flags(&self) -> Vec<String> {
        match self {
            Target::Lib(_) => vec!["--lib".into()],
            Target::Bin(n) => vec!["--bin".into(), n.clone()],
            Target::Test(n) => vec!["--test".into(), n.clone()],
        }
    }
}

/// The invocations that run the tests of `files` (test paths of the tree); `list(dir)` gives a
/// directory's entries as `read` does (a helper of `tests/common/` changed: every integration
/// target of its package runs).
pub fn plan(files: &[String], members: &[Member], list: &dyn Fn(&str) -> Vec<String>) -> Vec<Invocation> {
    let mut out: Vec<Invocation> = Vec::new();
    let mut add = |package: &str, target: Target, filter: Option<String>| {
        match out.iter_mut().find(|i| i.package == package && i.target == target) {
            Some(i) => {
                match filter {
                    // An unfiltered run of the target covers every filter.
                    None => i.filters.clear(),
                    Some(f) if !i.filters.is_empty() && !i.filters.contains(&f) => i.filters.push(f),
                    Some(_) => {}
                }
            }
            None => {
                out.push(Invocation { package: package.to_string(), target, filters: filter.into_iter().collect() })
            }
        }
    };
    for file in files {
        // The package whose directory holds the file: the deepest.
        let Some(m) = members
            .iter()
            .filter(|m| m.dir.is_empty() || file.starts_with(&format!("{}/", m.dir)))
            .max_by_key(|m| m.dir.len())
        else {
            continue;
        };
        let rel = if m.dir.is_empty() { file.as_str() } else { &file[m.dir.len() + 1..] };
        let Some(stem) = rel.strip_suffix(".rs") else { continue };
        if let Some(t) = stem.strip_prefix("tests/") {
            match t.split_once('/') {
                None => add(&m.name, Target::Test(t.to_string()), None),
                Some((name, "main")) => add(&m.name, Target::Test(name.to_string()), None),
                // A module shared by the integration targets: all of them.
                Some(_) => {
                    let dir = if m.dir.is_empty() { "tests/".to_string() } else { format!("{}/tests/", m.dir) };
                    for entry in list(&dir) {
                        if let Some(n) = entry.strip_suffix(".rs") {
                            add(&m.name, Target::Test(n.to_string()), None);
                        } else if let Some(d) = entry.strip_suffix('/') {
                            if list(&format!("{dir}{d}/")).iter().any(|e| e == "main.rs") {
                                add(&m.name, Target::Test(d.to_string()), None);
                            }
                        }
                    }
                }
            }
        } else if let Some(module) = stem.strip_prefix("src/") {
            if let Some(bin) = module.strip_prefix("bin/") {
                let (name, rest) = bin.split_once('/').unwrap_or((bin, "main"));
                add(&m.name, Target::Bin(name.to_string()), module_filter(rest));
                continue;
            }
            let target = match &m.lib {
                Some(lib) => Target::Lib(lib.clone()),
                None => Target::Bin(m.name.clone()),
            };
            add(&m.name, target, module_filter(module));
        }
    }
    out.sort();
    out
}

/// libtest's filter for the tests of a module file (`parser/tests.rs` → `parser::tests::`);
/// the crate root's file: none (every test).
fn module_filter(module: &str) -> Option<String> {
    let mut parts: Vec<&str> = module.split('/').collect();
    if matches!(parts.last(), Some(&"mod") | Some(&"lib") | Some(&"main")) {
        parts.pop();
    }
    (!parts.is_empty()).then(|| format!("{}::", parts.join("::")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |p: &str| {
            if p.is_empty() || p.ends_with('/') {
                let mut names: Vec<String> = files
                    .iter()
                    .filter_map(|(f, _)| f.strip_prefix(p))
                    .map(|rest| match rest.split_once('/') {
                        Some((d, _)) => format!("{d}/"),
                        None => rest.to_string(),
                    })
                    .collect();
                names.dedup();
                return (!names.is_empty()).then(|| names.join("\n"));
            }
            files.iter().find(|(f, _)| *f == p).map(|(_, t)| t.to_string())
        }
    }

    #[test]
    fn a_workspace_its_members_and_their_path_dependencies() {
        let read = tree(&[
            ("Cargo.toml", "[workspace]\nmembers = [\"crates/*\"]\nexclude = [\"crates/old\"]\n"),
            ("Cargo.lock", "version = 3\n"),
            ("rust-toolchain.toml", "[toolchain]\nchannel = \"1.70.0\"\n"),
            ("crates/core/Cargo.toml", "[package]\nname = \"my-core\"\nversion = \"0.2.0\"\n\n[dependencies]\nserde = { version = \"1\", features = [\"derive\"] }\nutil = { path = \"../../util\" }\n"),
            ("crates/core/src/lib.rs", ""),
            ("crates/cli/Cargo.toml", "[package]\nname = \"cli\"\nversion = \"0.2.0\"\n\n[[bin]]\nname = \"cli\"\n\n[dev-dependencies]\nassert_cmd = \"2\"\n\n[[test]]\nname = \"it\"\npath = \"tests/it/main.rs\"\n"),
            ("crates/old/Cargo.toml", "[package]\nname = \"old\"\n"),
            ("util/Cargo.toml", "[package]\nname = \"util\"\nversion = \"0.1.0\"\n[lib]\nname = \"u\"\npath = \"lib.rs\"\n"),
        ]);
        let s = read_spec(&read).unwrap();
        let members: Vec<(&str, &str, Option<&str>)> =
            s.members.iter().map(|m| (m.dir.as_str(), m.name.as_str(), m.lib.as_deref())).collect();
        assert_eq!(
            members,
            [("crates/cli", "cli", None), ("crates/core", "my-core", Some("my_core")), ("util", "util", Some("u"))]
        );
        assert_eq!(s.requirements, ["assert_cmd 2", "serde 1"]);
        let mut declared = s.declared_targets.clone();
        declared.sort();
        assert_eq!(declared, ["crates/cli/src/main.rs", "crates/cli/tests/it/main.rs", "util/lib.rs"]);
        assert_eq!(s.toolchain_file, Some(("rust-toolchain.toml".into(), "1.70.0".into())));
        assert!(s.files.contains(&"Cargo.lock".to_string()) && s.lock.is_some());
        assert_eq!(s.manifests.len(), 4, "{:?}", s.files);
        let escape = tree(&[("Cargo.toml", "[package]\nname = \"a\"\n[dependencies]\nb = { path = \"../b\" }\n")]);
        assert!(read_spec(&escape).unwrap_err().contains("outside the tree"));
    }

    #[test]
    fn test_files_become_targets_and_module_filters() {
        let members = vec![
            Member { dir: String::new(), name: "calc".into(), lib: Some("calc".into()) },
            Member { dir: "tool".into(), name: "tool".into(), lib: None },
        ];
        let list = |d: &str| -> Vec<String> {
            match d {
                "tests/" => vec!["common/".into(), "parse.rs".into(), "suite/".into()],
                "tests/suite/" => vec!["main.rs".into(), "a.rs".into()],
                "tests/common/" => vec!["mod.rs".into()],
                _ => vec![],
            }
        };
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            plan(
                &f(&["tests/parse.rs", "src/parser/tests.rs", "src/lexer/tests/mod.rs", "tool/src/tests.rs"]),
                &members,
                &list
            ),
            [
                Invocation {
                    package: "calc".into(),
                    target: Target::Lib("calc".into()),
                    filters: f(&["parser::tests::", "lexer::tests::"])
                },
                Invocation { package: "calc".into(), target: Target::Test("parse".into()), filters: vec![] },
                Invocation { package: "tool".into(), target: Target::Bin("tool".into()), filters: f(&["tests::"]) },
            ]
        );
        let shared = plan(&f(&["tests/common/mod.rs"]), &members, &list);
        let names: Vec<&str> = shared.iter().map(|i| i.target.name()).collect();
        assert_eq!(names, ["parse", "suite"]);
        // The crate root holds tests of every module: no filter.
        assert_eq!(plan(&f(&["src/lib.rs", "src/tests.rs"]), &members, &list)[0].filters, Vec::<String>::new());
    }
}
