//! What a tree declares about its Python environment, read without running any of it:
//! pyproject.toml, setup.cfg, setup.py (by pattern), the first test requirements file with its
//! `-r` includes, else tox's `[testenv] deps`; requirement names, the project's version, and
//! whether an interpreter meets `requires-python`.

use std::collections::BTreeSet;
use std::path::Path;

/// What a tree declares about its Python environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spec {
    /// Files read, in order.
    pub files: Vec<String>,
    /// The project's name (left out of the requirements: the tree is on PYTHONPATH).
    pub name: Option<String>,
    pub requires_python: Option<String>,
    /// The project's own dependencies.
    pub dependencies: Vec<String>,
    /// Test requirements (a requirements file, tox's deps, a test extra or group).
    pub test_requirements: Vec<String>,
    /// The project's version as the tree states it (`3.1.0.dev0`).
    pub version: Option<String>,
    /// The Python versions its `Programming Language :: Python :: X.Y` classifiers name.
    pub classifiers: Vec<String>,
    /// Why its tests need the project installed, not only on `PYTHONPATH` (entry points, a
    /// pytest plugin, compiled extensions, its own metadata read at import).
    pub install_reason: Option<String>,
}

impl Spec {
    /// Whether the tree is a Python project at all.
    pub fn is_python(&self) -> bool {
        self.files.iter().any(|f| ["pyproject.toml", "setup.py", "setup.cfg"].contains(&f.as_str()))
    }

    /// What the resolver is asked for: dependencies then test requirements, without the
    /// project itself, pytest added when nothing names it; with `relax`, the test tooling's
    /// pins dropped.
    pub fn requirements(&self, relax: bool) -> Vec<String> {
        let own = self.name.as_deref().map(normalize);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for r in self.dependencies.iter().chain(&self.test_requirements) {
            let name = requirement_name(r);
            if name.is_empty() || own.as_deref() == Some(name.as_str()) {
                continue;
            }
            let r = if relax && is_tooling(&name) { relaxed_requirement(r) } else { r.clone() };
            if seen.insert(r.clone()) {
                out.push(r);
            }
        }
        if !out.iter().any(|r| requirement_name(r) == "pytest") {
            out.push("pytest".to_string());
        }
        out
    }
}

/// Reads the spec from the tree's files (`read(path)` gives a file's text).
pub fn read_spec(read: &dyn Fn(&str) -> Option<String>) -> Spec {
    let mut s = Spec::default();
    if let Some(text) = read("pyproject.toml") {
        s.files.push("pyproject.toml".into());
        if let Ok(doc) = text.parse::<toml::Table>() {
            if let Some(p) = doc.get("project").and_then(|v| v.as_table()) {
                s.name = p.get("name").and_then(|v| v.as_str()).map(str::to_string);
                s.requires_python = p.get("requires-python").and_then(|v| v.as_str()).map(str::to_string);
                s.version = p.get("version").and_then(|v| v.as_str()).map(str::to_string);
                s.dependencies.extend(strings(p.get("dependencies")));
                s.classifiers.extend(python_classifiers(&strings(p.get("classifiers")).join("\n")));
                if let Some(extras) = p.get("optional-dependencies").and_then(|v| v.as_table()) {
                    for key in TEST_EXTRAS {
                        s.test_requirements.extend(strings(extras.get(key)));
                    }
                }
            }
            if let Some(groups) = doc.get("dependency-groups").and_then(|v| v.as_table()) {
                for key in TEST_EXTRAS {
                    s.test_requirements.extend(strings(groups.get(key)));
                }
            }
        }
    }
    if let Some(text) = read("setup.cfg") {
        s.files.push("setup.cfg".into());
        let get = |section: &str, key: &str| ini_value(&text, section, key);
        if s.name.is_none() {
            s.name = get("metadata", "name").map(|v| v.trim().to_string());
        }
        if s.requires_python.is_none() {
            s.requires_python = get("options", "python_requires").map(|v| v.trim().to_string());
        }
        if s.version.is_none() {
            s.version = get("metadata", "version").map(|v| v.trim().to_string());
        }
        if s.dependencies.is_empty() {
            s.dependencies.extend(get("options", "install_requires").map(|v| lines(&v)).unwrap_or_default());
        }
        for key in TEST_EXTRAS {
            s.test_requirements.extend(get("options.extras_require", key).map(|v| lines(&v)).unwrap_or_default());
        }
        if s.classifiers.is_empty() {
            s.classifiers = python_classifiers(&get("metadata", "classifiers").unwrap_or_default());
        }
    }
    if let Some(text) = read("setup.py") {
        s.files.push("setup.py".into());
        // The list after a match of `opening` (which ends at its `[`), to its own `]`: a
        // requirement's extras (`coverage[toml]`) do not end it.
        let list = |opening: &str| -> Vec<String> {
            let Some(m) = regex::Regex::new(opening).ok().and_then(|r| r.find(&text)) else { return Vec::new() };
            quoted(bracketed(&text[m.end()..]))
        };
        let first = |re: &str| -> Option<String> {
            regex::Regex::new(re).ok()?.captures(&text).and_then(|c| quoted(&c[1]).into_iter().next())
        };
        if s.dependencies.is_empty() {
            // `install_requires=[...]`, or `INSTALL_REQUIRES = [...]` passed to setup() by name.
            s.dependencies = list(r"(?si)install_requires\s*=\s*\[");
        }
        if s.test_requirements.is_empty() {
            // The tests extra where there is one: a `dev` extra listed before it may hold
            // nothing the tests import (structlog's `"dev": ["colorama"]`).
            s.test_requirements = list(r#"["'](?:tests?|testing)["']\s*:\s*\["#);
            if s.test_requirements.is_empty() {
                s.test_requirements = list(r#"["']dev["']\s*:\s*\["#);
            }
        }
        if s.classifiers.is_empty() {
            s.classifiers = python_classifiers(&text);
        }
        if s.name.is_none() {
            s.name = first(r#"(?s)\bname\s*=\s*(["'][^"']+["'])"#);
        }
        if s.requires_python.is_none() {
            s.requires_python = first(r#"(?s)python_requires\s*=\s*(["'][^"']+["'])"#);
        }
        if s.version.is_none() {
            s.version = first(r#"(?s)\bversion\s*=\s*(["'][^"']+["'])"#);
        }
    }
    s.version = package_version(s.version.take(), s.name.as_deref(), read);
    s.install_reason = install_reason(s.name.as_deref(), read);
    // A test requirements file (pinned by pip-compile in many projects: the pins of the PR's
    // day), else tox's test deps.
    const FILES: &[&str] = &[
        "requirements/tests.txt",
        "requirements/test.txt",
        "requirements/testing.txt",
        "requirements-test.txt",
        "requirements-tests.txt",
        "requirements_test.txt",
        "test-requirements.txt",
        "test_requirements.txt",
        "tests/requirements.txt",
        "requirements/tests.in",
        "requirements/test.in",
    ];
    // Where a tree keeps no test requirements, its development requirements hold them
    // (`pretend`, `freezegun` beside linters and docs tools).
    const DEV_FILES: &[&str] = &[
        "dev-requirements.txt",
        "requirements-dev.txt",
        "requirements_dev.txt",
        "requirements/dev.txt",
        "requirements/development.txt",
        "requirements/dev.in",
    ];
    let mut found = false;
    for f in FILES.iter().chain(DEV_FILES) {
        if let Some(reqs) = requirements_file(f, read, &mut s.files, 0) {
            s.test_requirements.extend(reqs);
            found = true;
            break;
        }
    }
    if !found {
        if let Some(text) = read("tox.ini") {
            s.files.push("tox.ini".into());
            let deps = ini_value(&text, "testenv", "deps").unwrap_or_default();
            // Factors are alternative environments: `threads: twisted` and `oldtwisted:
            // twisted < 17` cannot both hold, so a package keeps its first line.
            let mut factored: Vec<String> = Vec::new();
            for line in lines(&deps) {
                let line = line.replace("{toxinidir}/", "");
                let Some((line, factor)) = tox_dep(&line) else { continue };
                if let Some(file) = line.strip_prefix("-r").map(str::trim) {
                    s.test_requirements.extend(requirements_file(file, read, &mut s.files, 0).unwrap_or_default());
                } else if !line.starts_with('-') && !line.starts_with('.') && !line.contains('{') {
                    if factor {
                        factored.push(line);
                    } else {
                        s.test_requirements.push(line);
                    }
                }
            }
            for line in factored {
                let name = requirement_name(&line);
                if !s.test_requirements.iter().any(|r| requirement_name(r) == name) {
                    s.test_requirements.push(line);
                }
            }
        }
    }
    s
}

/// Why a tree must be installed for its tests to run: what only an installed distribution has
/// — console scripts the tests may call, a pytest plugin registered by entry point, compiled
/// extensions, its own metadata read at import. Other entry points (Babel's extractors, say)
/// are not read by tests: the tree stays on `PYTHONPATH` alone, the fast path.
fn install_reason(name: Option<&str>, read: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    const COMPILERS: &[&str] = &[
        "cython",
        "pybind11",
        "setuptools-rust",
        "setuptools_rust",
        "maturin",
        "scikit-build",
        "meson-python",
        "cffi",
    ];
    const PLUGIN: &str = "a pytest plugin registered by entry point";
    const SCRIPTS: &str = "console scripts";
    if let Some(text) = read("pyproject.toml") {
        if let Ok(doc) = text.parse::<toml::Table>() {
            let project = doc.get("project").and_then(|v| v.as_table());
            if project
                .and_then(|p| p.get("entry-points"))
                .and_then(|v| v.as_table())
                .is_some_and(|e| e.contains_key("pytest11"))
            {
                return Some(PLUGIN.into());
            }
            if project.is_some_and(|p| p.contains_key("scripts") || p.contains_key("gui-scripts")) {
                return Some(SCRIPTS.into());
            }
            let requires = strings(doc.get("build-system").and_then(|b| b.get("requires")));
            if let Some(c) = requires.iter().find(|r| COMPILERS.contains(&requirement_name(r).as_str())) {
                return Some(format!("compiled extensions (builds with {})", requirement_name(c)));
            }
            if doc.get("tool").and_then(|t| t.get("maturin")).is_some() {
                return Some("compiled extensions (maturin)".into());
            }
        }
    }
    for (file, text) in ["setup.cfg", "setup.py"].iter().filter_map(|f| read(f).map(|t| (*f, t))) {
        if text.contains("pytest11") {
            return Some(PLUGIN.into());
        }
        if text.contains("console_scripts") {
            return Some(SCRIPTS.into());
        }
        if file == "setup.py" && (text.contains("ext_modules") || text.contains("cythonize(")) {
            return Some("compiled extensions (setup.py ext_modules)".into());
        }
    }
    // Its own version read from its installed metadata when it is imported.
    let module = name?.to_ascii_lowercase().replace(['-', '.'], "_");
    let init = ["src/", ""]
        .iter()
        .find_map(|p| read(&format!("{p}{module}/__init__.py")).or_else(|| read(&format!("{p}{module}.py"))))?;
    let reads_metadata =
        ["importlib.metadata", "importlib_metadata", "pkg_resources.get_distribution", "get_distribution("]
            .iter()
            .any(|m| init.contains(m));
    reads_metadata.then(|| "it reads its own installed metadata at import".into())
}

/// The extras and dependency groups that hold test requirements (setup.py's `dev` extra too,
/// where it has none of these).
const TEST_EXTRAS: [&str; 3] = ["test", "tests", "testing"];

/// The Python versions named by `Programming Language :: Python :: X[.Y]` classifiers, in order.
fn python_classifiers(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"Programming Language :: Python :: (\d+(?:\.\d+)?)\b").expect("a valid pattern");
    let mut out: Vec<String> = Vec::new();
    for c in re.captures_iter(text) {
        if !out.contains(&c[1].to_string()) {
            out.push(c[1].to_string());
        }
    }
    out
}

/// The version a tree states: given, or behind `attr: pkg.__version__`, or the package's
/// `__version__` (under `src/` or at the top).
fn package_version(given: Option<String>, name: Option<&str>, read: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let re = regex::Regex::new(r#"(?m)^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']"#).expect("a valid pattern");
    let from_init = |module: &str| -> Option<String> {
        let rel = module.replace('.', "/");
        ["src/", ""].iter().find_map(|prefix| {
            let text = read(&format!("{prefix}{rel}/__init__.py")).or_else(|| read(&format!("{prefix}{rel}.py")))?;
            re.captures(&text).map(|c| c[1].to_string())
        })
    };
    match given {
        Some(v) if v.starts_with("attr:") => {
            let attr = v.trim_start_matches("attr:").trim();
            from_init(attr.rsplit_once('.').map_or(attr, |(m, _)| m))
        }
        Some(v) if !v.is_empty() && !v.contains('{') => Some(v),
        _ => from_init(&name?.to_ascii_lowercase().replace('-', "_")),
    }
}

/// `major.minor` of a version (what SWE-bench's `version` holds).
pub fn major_minor(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// A line of tox's `deps`: `factor: dep` keeps `dep` unless every factor names a Python version
/// (`py26,py33: py<1.5` pins for interpreters of their own).
/// The dep, and whether it belongs to a factor.
fn tox_dep(line: &str) -> Option<(String, bool)> {
    let re = regex::Regex::new(r"^([A-Za-z0-9_,!\-]+):\s+(.*)$").expect("a valid pattern");
    let Some(c) = re.captures(line) else { return Some((line.to_string(), false)) };
    let version = regex::Regex::new(r"^!?(py|pypy)\d*$").expect("a valid pattern");
    if c[1].split(',').all(|f| version.is_match(f)) {
        None
    } else {
        Some((c[2].trim().to_string(), true))
    }
}

/// The requirement lines of a requirements file and of the files it includes with `-r`.
fn requirements_file(
    path: &str,
    read: &dyn Fn(&str) -> Option<String>,
    files: &mut Vec<String>,
    depth: usize,
) -> Option<Vec<String>> {
    if depth > 3 || files.iter().any(|f| f == path) {
        return Some(Vec::new());
    }
    let text = read(path)?;
    files.push(path.to_string());
    let dir = Path::new(path).parent().map(|p| p.to_string_lossy().to_string()).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.replace("\\\n", " ").lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(inc) = line.strip_prefix("-r ").or_else(|| line.strip_prefix("--requirement ")) {
            let inc = inc.trim();
            let joined = if dir.is_empty() { inc.to_string() } else { format!("{dir}/{inc}") };
            out.extend(requirements_file(&joined, read, files, depth + 1).unwrap_or_default());
            continue;
        }
        if line.starts_with('-') || line.starts_with('.') || line.contains("://") {
            continue;
        }
        let req = line.split(" --hash").next().unwrap_or(line).trim().to_string();
        out.push(req);
    }
    Some(out)
}

fn strings(v: Option<&toml::Value>) -> Vec<String> {
    v.and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str()).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The quoted strings of a Python list's text.
/// `text` up to the `]` that closes a list opened just before it (brackets inside quotes and
/// nested lists skipped).
fn bracketed(text: &str) -> &str {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return &text[..i],
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    text
}

fn quoted(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r#""([^"]*)"|'([^']*)'"#).expect("a valid pattern");
    re.captures_iter(text)
        .filter_map(|c| c.get(1).or_else(|| c.get(2)).map(|m| m.as_str().trim().to_string()))
        .filter(|s| !s.is_empty())
        .collect()
}

/// A value of an INI file's section, continuation lines included.
fn ini_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut in_section = false;
    let mut value: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            if value.is_some() {
                break;
            }
            in_section = &t[1..t.len() - 1] == section;
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some(v) = value.as_mut() {
            // A comment line inside a multi-line value (`# General`) does not end it.
            if t.starts_with('#') || t.starts_with(';') {
                continue;
            }
            if line.starts_with(' ') || line.starts_with('\t') || t.is_empty() {
                v.push('\n');
                v.push_str(t);
                continue;
            }
            break;
        }
        if let Some((k, v)) = t.split_once('=') {
            if k.trim() == key {
                value = Some(v.trim().to_string());
            }
        }
    }
    value
}

/// The non-empty, non-comment lines of a multi-line value.
fn lines(v: &str) -> Vec<String> {
    v.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// PEP 503's normal form of a requirement's name.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = if c == '_' || c == '.' { '-' } else { c.to_ascii_lowercase() };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out
}

/// The name of a requirement line (`MarkupSafe>=2.0; python_version...` → `markupsafe`).
pub fn requirement_name(req: &str) -> String {
    let end = req.find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c))).unwrap_or(req.len());
    normalize(&req[..end])
}

/// Test tooling: what may float to a release that runs on the interpreter (pytest, its
/// plugins and helpers, and test libraries that load as pytest plugins or beside them).
pub fn is_tooling(name: &str) -> bool {
    name == "pytest"
        || name.starts_with("pytest-")
        || [
            "py",
            "pluggy",
            "iniconfig",
            "atomicwrites",
            "more-itertools",
            "wcwidth",
            "exceptiongroup",
            "tomli",
            "hypothesis",
            "coverage",
            "mock",
        ]
        .contains(&name)
}

/// A requirement without its version pin (extras and markers kept).
fn relaxed_requirement(req: &str) -> String {
    let name_end = req.find(|c: char| !(c.is_ascii_alphanumeric() || "-_.[],".contains(c))).unwrap_or(req.len());
    let marker = req.find(';').map(|i| &req[i..]).unwrap_or("");
    format!("{}{}", req[..name_end].trim(), if marker.is_empty() { String::new() } else { format!(" {marker}") })
}

/// Whether `version` (3.11.7) meets a PEP 440 specifier set (`>=3.7, !=3.8.*, <4`); clauses
/// it cannot read are taken as met.
pub fn python_meets(version: &str, spec: &str) -> bool {
    let v: Vec<u64> = version.split('.').filter_map(|x| x.parse().ok()).collect();
    let cmp = |other: &[u64]| -> std::cmp::Ordering {
        for i in 0..other.len().max(v.len()) {
            let (a, b) = (v.get(i).copied().unwrap_or(0), other.get(i).copied().unwrap_or(0));
            if a != b {
                return a.cmp(&b);
            }
        }
        std::cmp::Ordering::Equal
    };
    spec.split(',').map(str::trim).filter(|c| !c.is_empty()).all(|clause| {
        let op_end = clause.find(|c: char| c.is_ascii_digit()).unwrap_or(clause.len());
        let (op, rest) = clause.split_at(op_end);
        let rest = rest.trim();
        let wildcard = rest.ends_with(".*");
        let nums: Vec<u64> = rest.trim_end_matches(".*").split('.').filter_map(|x| x.parse().ok()).collect();
        if nums.is_empty() {
            return true;
        }
        let prefix_eq = v.len() >= nums.len() && v[..nums.len()] == nums[..];
        use std::cmp::Ordering::*;
        match (op.trim(), wildcard) {
            (">=", _) => cmp(&nums) != Less,
            (">", _) => cmp(&nums) == Greater,
            ("<=", _) => cmp(&nums) != Greater,
            ("<", _) => cmp(&nums) == Less,
            ("==", true) => prefix_eq,
            ("!=", true) => !prefix_eq,
            ("==", false) | ("===", false) => cmp(&nums) == Equal,
            ("!=", false) => cmp(&nums) != Equal,
            ("~=", _) => {
                let floor = cmp(&nums) != Less;
                let keep = nums.len().saturating_sub(1).max(1);
                floor && v.len() >= keep && v[..keep] == nums[..keep]
            }
            _ => true,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requires_python_clauses() {
        assert!(python_meets("3.11.7", ">=3.7"));
        assert!(!python_meets("3.11.7", "<3.11"));
        assert!(python_meets("3.11.7", ">=3.6, !=3.0.*, <4"));
        assert!(!python_meets("3.11.7", "!=3.11.*"));
        assert!(python_meets("3.11.7", "~=3.8"));
        assert!(!python_meets("3.11.7", "~=3.8.1"));
        assert!(python_meets("3.11.7", "==3.11.*"));
        assert!(!python_meets("2.7.18", ">=3.7"));
    }

    #[test]
    fn a_setup_cfg_project_with_a_pinned_test_file_reads_as_its_tree_says() {
        let files = |p: &str| -> Option<String> {
            match p {
                "src/jinja2/__init__.py" => Some("\"\"\"Jinja\"\"\"\n__version__ = \"3.1.0.dev0\"\n".into()),
                "setup.cfg" => Some("[metadata]\nname = Jinja2\nversion = attr: jinja2.__version__\n\n[options]\npackages = find:\ninstall_requires =\n    MarkupSafe>=2.0\npython_requires = >=3.7\n\n[options.extras_require]\ni18n =\n    Babel>=2.7\n".into()),
                "setup.py" => Some("from setuptools import setup\nsetup(name=\"Jinja2\")\n".into()),
                "requirements/tests.txt" => Some("# comment\nattrs==21.4.0\n    # via pytest\npytest==7.1.2\n    # via -r requirements/tests.in\n-r base.txt\n".into()),
                "requirements/base.txt" => Some("tomli==2.0.1 ; python_version < \"3.11\"\n".into()),
                _ => None,
            }
        };
        let s = read_spec(&files);
        assert_eq!(s.files, ["setup.cfg", "setup.py", "requirements/tests.txt", "requirements/base.txt"]);
        assert_eq!(s.name.as_deref(), Some("Jinja2"));
        assert_eq!(s.requires_python.as_deref(), Some(">=3.7"));
        assert_eq!(s.dependencies, ["MarkupSafe>=2.0"]);
        assert_eq!(s.version.as_deref(), Some("3.1.0.dev0"));
        assert_eq!(major_minor("3.1.0.dev0"), "3.1");
        assert_eq!(
            s.requirements(false),
            ["MarkupSafe>=2.0", "attrs==21.4.0", "pytest==7.1.2", "tomli==2.0.1 ; python_version < \"3.11\""]
        );
        assert_eq!(
            s.requirements(true),
            ["MarkupSafe>=2.0", "attrs==21.4.0", "pytest", "tomli ; python_version < \"3.11\""]
        );
    }

    #[test]
    fn tox_deps_read_past_comment_lines_and_other_interpreters_pins() {
        let files = |p: &str| -> Option<String> {
            (p == "tox.ini").then(|| {
                "[tox]\nenvlist = py27, py33\n\n[testenv]\ndeps=\n# General\n    greenlet\n    pytest\n\n# Python 2\n    py26: python-memcached\n    normal: pyopenssl\n\n[testenv:docs]\ndeps = sphinx\n".into()
            })
        };
        let s = read_spec(&files);
        assert_eq!(s.test_requirements, ["greenlet", "pytest", "pyopenssl"]);
    }

    #[test]
    fn the_tests_extra_before_dev_and_one_line_per_package_of_tox_factors() {
        // structlog's setup.py and tox.ini of January 2018.
        let files = |p: &str| -> Option<String> {
            match p {
                "setup.py" => Some("INSTALL_REQUIRES = [\"six\"]\nEXTRAS_REQUIRE = {\n    \"dev\": [\"colorama\"],\n    \"tests\": [\n        \"coverage[toml]\",\n        \"freezegun>=0.2.8\",\n        \"pretend\",\n    ],\n}\nsetup(install_requires=INSTALL_REQUIRES, extras_require=EXTRAS_REQUIRE)\n".into()),
                "tox.ini" => Some("[testenv]\nextras = tests\ndeps =\n    greenlets: greenlet\n    threads,greenlets,colorama: twisted\n    oldtwisted: twisted < 17\n    py36: python-rapidjson\n".into()),
                _ => None,
            }
        };
        let s = read_spec(&files);
        assert_eq!(s.dependencies, ["six"]);
        assert_eq!(s.test_requirements, ["coverage[toml]", "freezegun>=0.2.8", "pretend", "greenlet", "twisted"]);
    }

    #[test]
    fn a_pyproject_project_drops_itself_and_gains_pytest() {
        let files = |p: &str| -> Option<String> {
            (p == "pyproject.toml").then(|| {
                "[project]\nname = \"click_extra\"\ndependencies = [\"click-extra>=1\", \"colorama; platform_system == 'Windows'\"]\nrequires-python = \">=3.8\"\n".into()
            })
        };
        let s = read_spec(&files);
        assert!(s.is_python());
        assert_eq!(s.requirements(false), ["colorama; platform_system == 'Windows'", "pytest"]);
        assert_eq!(requirement_name("MarkupSafe>=2.0"), "markupsafe");
        assert_eq!(tox_dep("normal: pyopenssl"), Some(("pyopenssl".into(), true)));
        assert_eq!(tox_dep("py26,py33: py<1.5"), None);
        assert_eq!(tox_dep("pytest-xprocess"), Some(("pytest-xprocess".into(), false)));
        assert_eq!(requirement_name("zope.interface[test]"), "zope-interface");
    }

    #[test]
    fn development_requirements_and_classifiers_are_read_where_no_test_file_is() {
        let files = |p: &str| -> Option<String> {
            match p {
                "setup.py" => Some("setup(name='pkg', classifiers=[\n 'Programming Language :: Python :: 2',\n 'Programming Language :: Python :: 2.7',\n 'Programming Language :: Python :: 3.5',\n], extras_require={'dev': ['freezegun']})\n".into()),
                "dev-requirements.txt" => Some("pretend\npytest>=3\n".into()),
                _ => None,
            }
        };
        let s = read_spec(&files);
        assert_eq!(s.classifiers, ["2", "2.7", "3.5"]);
        assert_eq!(s.test_requirements, ["freezegun", "pretend", "pytest>=3"]);
        assert_eq!(s.files, ["setup.py", "dev-requirements.txt"]);
        assert_eq!(s.install_reason, None);
    }

    #[test]
    fn what_makes_a_tree_need_installing() {
        let reason = |files: &'static [(&'static str, &'static str)]| {
            read_spec(&move |p: &str| files.iter().find(|(k, _)| *k == p).map(|(_, v)| v.to_string())).install_reason
        };
        assert_eq!(
            reason(&[("pyproject.toml", "[project]\nname = \"a\"\n[project.scripts]\na = \"a:main\"\n")]).as_deref(),
            Some("console scripts")
        );
        // jinja's setup.py of 2013: Babel's extractors are not read by its tests.
        assert_eq!(
            reason(&[("setup.py", "setup(name='Jinja2', entry_points=\"\"\"\n[babel.extractors]\njinja2 = jinja2.ext:babel_extract\n\"\"\")")]),
            None
        );
        assert_eq!(
            reason(&[("setup.py", "setup(name='p', entry_points={'pytest11': ['p = p.plugin']})")]).as_deref(),
            Some("a pytest plugin registered by entry point")
        );
        assert!(reason(&[("pyproject.toml", "[build-system]\nrequires = [\"setuptools\", \"Cython>=3\"]\n")])
            .is_some_and(|r| r.contains("cython")));
        assert!(reason(&[
            ("pyproject.toml", "[project]\nname = \"my-pkg\"\n"),
            ("src/my_pkg/__init__.py", "from importlib.metadata import version\n__version__ = version('my-pkg')\n"),
        ])
        .is_some_and(|r| r.contains("metadata")));
        assert_eq!(reason(&[("pyproject.toml", "[project]\nname = \"calc\"\n")]), None);
    }
}
