//! The crate's arrows run one way: infrastructure ← stages ← orchestration ← the command line
//! (the table in `src/lib.rs`). Checked from the sources, so a new import that runs backwards
//! fails here with the file and the line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of the `swelake` crate with its layer, read from the module
/// declarations of `src/lib.rs` under its four section comments (`// Infrastructure.`,
/// `// Stages.`, `// Orchestration.`, `// The command line.`): the one list, which the docs
/// are checked against.
fn layers() -> BTreeMap<String, u8> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut out = BTreeMap::new();
    let mut layer = 0u8;
    for line in lib.lines().map(str::trim) {
        match line {
            "// Infrastructure." => layer = 1,
            "// Stages." => layer = 2,
            "// Orchestration." => layer = 3,
            "// The command line." => layer = 4,
            _ => {}
        }
        let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
        let names: Vec<String> = if let Some(m) = decl.strip_prefix("mod ") {
            vec![m.trim_end_matches(';').to_string()]
        } else if let Some(u) = decl.strip_prefix("use ") {
            // `use swelake_core::{a, b};` or `use swelake_reward as reward;`
            match (u.split_once('{'), u.split_once(" as ")) {
                (Some((_, group)), _) => {
                    group.trim_end_matches("};").split(',').map(|n| n.trim().to_string()).collect()
                }
                (None, Some((_, name))) => vec![name.trim_end_matches(';').to_string()],
                _ => vec![],
            }
        } else {
            vec![]
        };
        for name in names.into_iter().filter(|n| !n.is_empty()) {
            assert!(layer > 0, "src/lib.rs declares `{name}` before its first layer comment");
            out.insert(name, layer);
        }
    }
    out
}

/// The modules each item of a numbered list ("1. …" to "4. …") names in backticks, by item
/// number; `lines` are the list's lines without their comment markers.
fn numbered_list(lines: &[&str]) -> BTreeMap<u8, BTreeSet<String>> {
    let mut out: BTreeMap<u8, BTreeSet<String>> = BTreeMap::new();
    let mut item = 0u8;
    for line in lines {
        let t = line.trim();
        if let Some((n, _)) = t.split_once(". ") {
            if let Ok(n) = n.parse::<u8>() {
                item = n;
            }
        }
        if item == 0 {
            continue;
        }
        for (k, part) in t.split('`').enumerate() {
            if k % 2 == 1 && !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.entry(item).or_default().insert(part.to_string());
            }
        }
    }
    out
}

#[test]
fn the_layer_list_of_lib_rs_and_of_the_design_doc_are_the_declarations() {
    let mut want: BTreeMap<u8, BTreeSet<String>> = BTreeMap::new();
    for (name, layer) in layers() {
        want.entry(layer).or_default().insert(name);
    }
    assert_eq!(want.len(), 4, "{want:?}");
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let doc: Vec<&str> =
        lib.lines().filter_map(|l| l.strip_prefix("//!")).skip_while(|l| !l.contains("four layers")).skip(1).collect();
    assert_eq!(numbered_list(&doc), want, "the layer list opening src/lib.rs");
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let list: Vec<&str> = design
        .lines()
        .skip_while(|l| !l.starts_with("## Layers"))
        .skip(1)
        .take_while(|l| !l.starts_with("Each stage"))
        .collect();
    assert_eq!(numbered_list(&list), want, "the layer list of docs/design.md");
}

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
    let layers = layers();
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
            violations.push(format!("{}: module `{module}` is not declared in src/lib.rs", file.display()));
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
    assert_eq!(deps("swelake-reward/python"), vec!["swelake-reward"]);
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
