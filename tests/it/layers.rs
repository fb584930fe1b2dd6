//! The crate's arrows run one way: infrastructure ← stages ← orchestration ← the command line
//! (the table in `src/lib.rs`). Checked from the sources, so a new import that runs backwards
//! fails here with the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every top-level module of the `swelake` crate with its layer.
const LAYERS: &[(&str, u8)] = &[
    // 1. infrastructure (`models` … `rng` are re-exported from swelake-core)
    ("config", 1),
    ("files", 1),
    ("git", 1),
    ("lake", 1),
    ("lang", 1),
    ("query", 1),
    ("schema", 1),
    ("charts", 1),
    ("hash", 1),
    ("memory", 1),
    ("models", 1),
    ("progress", 1),
    ("rng", 1),
    // 2. stages (`reward` and `train` are the workspace crates)
    ("filters", 2),
    ("ingest", 2),
    ("prs", 2),
    ("relevance", 2),
    ("report", 2),
    ("seed", 2),
    ("snapshots", 2),
    ("reward", 2),
    ("train", 2),
    // 3. orchestration
    ("bench", 3),
    ("demo", 3),
    ("distributed", 3),
    ("jobs", 3),
    ("samples", 3),
    ("sql", 3),
    ("udfs", 3),
    // 4. the command line
    ("cli", 4),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file of `src/` belongs to: its first path component (`src/lake/runs.rs` is
/// `lake`, `src/query.rs` is `query`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a line names through `crate::…` (also inside `use crate::{a, b}`).
fn crate_refs(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` in macros means the same.
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            for item in group.split('}').next().unwrap_or("").split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

/// `line` without the contents of its string literals (test inputs that look like paths).
fn without_strings(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in line.chars() {
        if in_string {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => escaped = false,
            }
        } else {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// Whether a module of layer `from` may name module `to` of layer `to_layer`.
fn allowed(from: &str, from_layer: u8, to: &str, to_layer: u8) -> bool {
    if from == to || to_layer < from_layer {
        return true;
    }
    match from_layer {
        // Infrastructure builds on infrastructure, orchestration on orchestration.
        1 | 3 => to_layer == from_layer,
        // A stage uses no other stage but the reward.
        2 => to == "reward",
        _ => false,
    }
}

#[test]
fn modules_import_only_from_layers_below_their_own() {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&layer) = layers.get(module.as_str()) else {
            violations.push(format!("{}: module `{module}` has no layer in this test's table", file.display()));
            continue;
        };
        for (n, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let line = &without_strings(line);
            if line.contains("super::super::") {
                violations.push(format!(
                    "{}:{}: `super::super::` hides which module it reaches",
                    file.display(),
                    n + 1
                ));
            }
            for to in crate_refs(line) {
                match layers.get(to.as_str()) {
                    Some(&to_layer) if allowed(&module, layer, &to, to_layer) => {}
                    Some(&to_layer) => violations.push(format!(
                        "{}:{}: `{module}` (layer {layer}) uses `{to}` (layer {to_layer})",
                        file.display(),
                        n + 1
                    )),
                    None => violations.push(format!("{}:{}: unknown module `{to}`", file.display(), n + 1)),
                }
            }
        }
    }
    assert!(violations.is_empty(), "arrows that run the wrong way:\n{}", violations.join("\n"));
}

#[test]
fn only_the_command_line_knows_clap() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("crates"), &mut files);
    let cli = root().join("src/cli");
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&cli))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("clap::") || text.contains("use clap") || text.contains("ValueEnum")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "clap outside src/cli: {offenders:?}");
    for krate in ["swelake-core", "swelake-reward", "swelake-train", "pydifflib"] {
        let toml = std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
        assert!(!toml.contains("clap"), "{krate} depends on clap");
    }
}

/// The workspace crates import none of the pipeline: the shared one nothing, the reward only
/// pydifflib (its tests also the shared generator), the trainer the shared crate and the reward.
#[test]
fn workspace_crates_depend_only_downward() {
    let deps = |krate: &str| -> Vec<String> {
        let text = std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
        let doc: toml::Table = text.parse().unwrap();
        let mut names: Vec<String> = doc
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|t| t.keys().filter(|k| k.starts_with("swelake") || *k == "pydifflib").cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    assert_eq!(deps("swelake-core"), Vec::<String>::new());
    assert_eq!(deps("swelake-reward"), vec!["pydifflib"]);
    assert_eq!(deps("swelake-train"), vec!["swelake-core", "swelake-reward"]);
    assert_eq!(deps("pydifflib"), Vec::<String>::new());
}

#[test]
fn the_checker_sees_grouped_and_macro_paths() {
    assert_eq!(crate_refs("use crate::{lake::Lake, query};"), vec!["lake", "query"]);
    assert_eq!(crate_refs("match $crate::kernels::simd_level() {"), vec!["kernels"]);
    assert_eq!(crate_refs(&without_strings(r#"f("use crate::lexer::Token;") + crate::x"#)), vec!["x"]);
    assert!(allowed("seed", 2, "reward", 2));
    assert!(!allowed("seed", 2, "relevance", 2));
    assert!(!allowed("lake", 1, "udfs", 3));
    assert!(allowed("jobs", 3, "sql", 3));
}
