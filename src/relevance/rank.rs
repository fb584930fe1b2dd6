//! Ranking the files of a repository that a PR did not change by how relevant they are to it.
//!
//! Text alone is a weak signal (embedding whole files loses to BM25), so the ranker adds what
//! the task gives for free: the changed paths. A candidate scores for
//! - `bm25`: BM25 of the PR/issue text and the changed paths against its path and content;
//! - `embedding`: MiniLM similarity of that text to the candidate's best chunk (not its head);
//! - `imports`: it imports a changed module, or a changed file imports it;
//! - `tests`: it is the test of a changed module, or the module a changed test tests;
//! - `cochange`: how often it changed together with the changed files in the repository's
//!   earlier PRs;
//! - `same_dir`: it sits next to a changed file (weak on its own).
//!
//! Each feature is scaled to [0, 1] over the candidates and combined with the weights of the
//! curation config. `Ranker::Bm25` is the baseline: BM25 alone.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::bm25::Bm25;

/// Which ranker to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ranker {
    /// BM25 on text and changed paths (the baseline).
    Bm25,
    /// All features combined (default).
    Hybrid,
}

impl Ranker {
    pub fn name(self) -> &'static str {
        match self {
            Ranker::Bm25 => "bm25",
            Ranker::Hybrid => "hybrid-minilm",
        }
    }
}

/// Weights of the hybrid ranker (documented in `config/curation.toml`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    pub bm25: f64,
    pub embedding: f64,
    pub imports: f64,
    pub tests: f64,
    pub cochange: f64,
    pub same_dir: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights { bm25: 1.0, embedding: 1.0, imports: 0.8, tests: 0.8, cochange: 1.2, same_dir: 0.15 }
    }
}

/// One file that could be shown.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub path: String,
    pub blob: String,
    pub content: std::sync::Arc<str>,
    /// Best similarity of a chunk of the file to the query (filled by the caller).
    pub embedding_similarity: f32,
}

/// What the ranker knows about the PR.
pub struct Query<'a> {
    /// Issue and PR text.
    pub text: &'a str,
    /// Paths the PR changed (visible to the ranker).
    pub changed: &'a [String],
    /// Contents of the changed files at the merge base (for their imports), by path.
    pub changed_content: &'a HashMap<String, std::sync::Arc<str>>,
    /// Per candidate path: earlier PRs that changed it together with a changed file.
    pub cochange: &'a HashMap<String, f64>,
    /// Use the changed paths at all (false for the text-only variant).
    pub use_paths: bool,
}

fn stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name).to_lowercase()
}

fn dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The stem a test file tests (`test_foo`, `foo_test`, `foo.test`, `FooTest`, `foo.spec`).
fn tested_stem(path: &str) -> Option<String> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let base = name.split('.').next().unwrap_or(name);
    let lower = base.to_lowercase();
    let is_test_name = name.contains(".test.") || name.contains(".spec.");
    if let Some(s) = lower.strip_prefix("test_") {
        return Some(s.to_string());
    }
    for suffix in ["_test", "_tests", "test", "tests", "_spec", "spec"] {
        if let Some(s) = lower.strip_suffix(suffix) {
            if !s.is_empty() {
                return Some(s.trim_end_matches('_').to_string());
            }
        }
    }
    is_test_name.then_some(lower)
}

/// Module names a file imports (Python, JS/TS, Rust, Go, Java, C/C++), as last segments.
pub fn imported_names(content: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for line in content.lines().take(400) {
        let l = line.trim_start();
        // JavaScript first: `import x from "./m"` names its module in quotes, not after `import`.
        let js = l.find("require(").or_else(|| l.find(" from '")).or_else(|| l.find(" from \""));
        let spec: Option<&str> = if let Some(i) = js {
            l[i..].split(['\'', '"']).nth(1)
        } else if let Some(r) = l.strip_prefix("from ") {
            r.split_whitespace().next()
        } else if let Some(r) = l.strip_prefix("import ") {
            Some(r.split([' ', ',', ';']).next().unwrap_or(r).trim_matches(|c| c == '"' || c == '\''))
        } else if let Some(r) = l.strip_prefix("use ") {
            r.split([';', '{', ' ']).next()
        } else if let Some(r) = l.strip_prefix("#include") {
            Some(r.trim().trim_matches(|c| c == '"' || c == '<' || c == '>'))
        } else {
            None
        };
        if let Some(spec) = spec {
            for part in spec.split(['.', '/', ':']).filter(|p| !p.is_empty()) {
                out.insert(part.trim_matches(|c: char| !c.is_alphanumeric() && c != '_').to_lowercase());
            }
        }
    }
    out
}

fn scale(v: &mut [f64]) {
    let max = v.iter().cloned().fold(0.0f64, f64::max);
    if max > 0.0 {
        v.iter_mut().for_each(|x| *x /= max);
    }
}

/// Feature values of every candidate, unscaled.
pub struct Features {
    pub bm25: Vec<f64>,
    pub embedding: Vec<f64>,
    pub imports: Vec<f64>,
    pub tests: Vec<f64>,
    pub cochange: Vec<f64>,
    pub same_dir: Vec<f64>,
}

pub fn features(q: &Query, candidates: &[Candidate]) -> Features {
    let docs: Vec<String> = candidates
        .iter()
        .map(|c| {
            let head: String = c.content.chars().take(8000).collect();
            format!("{} {} {}", c.path, c.path, head)
        })
        .collect();
    let bm = Bm25::new(docs.iter().map(|d| d.as_str()));
    let query = if q.use_paths { format!("{} {}", q.text, q.changed.join(" ")) } else { q.text.to_string() };
    let bm25 = bm.scores(&query);
    let n = candidates.len();
    let (mut imports, mut tests, mut cochange, mut same_dir) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    if q.use_paths {
        let changed_stems: HashSet<String> = q.changed.iter().map(|p| stem(p)).collect();
        let changed_dirs: HashSet<&str> = q.changed.iter().map(|p| dir(p)).collect();
        let changed_tested: HashSet<String> = q.changed.iter().filter_map(|p| tested_stem(p)).collect();
        let changed_imports: HashSet<String> = q.changed_content.values().flat_map(|c| imported_names(c)).collect();
        for (i, c) in candidates.iter().enumerate() {
            let s = stem(&c.path);
            let imports_changed = imported_names(&c.content).iter().any(|n| changed_stems.contains(n));
            let imported_by_changed = changed_imports.contains(&s);
            imports[i] = f64::from(u8::from(imports_changed)) + f64::from(u8::from(imported_by_changed));
            let is_test_of_changed = tested_stem(&c.path).is_some_and(|t| changed_stems.contains(&t));
            let tested_by_changed = changed_tested.contains(&s);
            tests[i] = f64::from(u8::from(is_test_of_changed || tested_by_changed));
            cochange[i] = q.cochange.get(&c.path).copied().unwrap_or(0.0);
            same_dir[i] = f64::from(u8::from(changed_dirs.contains(dir(&c.path))));
        }
    }
    Features {
        bm25,
        embedding: candidates.iter().map(|c| f64::from(c.embedding_similarity.max(0.0))).collect(),
        imports,
        tests,
        cochange,
        same_dir,
    }
}

/// Scores (higher is more relevant) of every candidate.
pub fn score(ranker: Ranker, w: &Weights, f: Features) -> Vec<f64> {
    let Features { mut bm25, embedding, mut imports, mut tests, mut cochange, mut same_dir } = f;
    if ranker == Ranker::Bm25 {
        return bm25;
    }
    scale(&mut bm25);
    scale(&mut imports);
    scale(&mut tests);
    scale(&mut cochange);
    scale(&mut same_dir);
    // Similarities of unrelated text sit around 0.1-0.3 for this model: spread the top.
    let mut emb: Vec<f64> = embedding.iter().map(|e| (e - 0.15).max(0.0)).collect();
    scale(&mut emb);
    (0..bm25.len())
        .map(|i| {
            w.bm25 * bm25[i]
                + w.embedding * emb[i]
                + w.imports * imports[i]
                + w.tests * tests[i]
                + w.cochange * cochange[i]
                + w.same_dir * same_dir[i]
        })
        .collect()
}

/// Candidate indexes by descending score (ties: path order, for determinism).
pub fn order(scores: &[f64], candidates: &[Candidate]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then_with(|| candidates[a].path.cmp(&candidates[b].path)));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_and_import_relations() {
        assert_eq!(tested_stem("tests/test_ops.py").as_deref(), Some("ops"));
        assert_eq!(tested_stem("pkg/ops_test.go").as_deref(), Some("ops"));
        assert_eq!(tested_stem("src/OpsTest.java").as_deref(), Some("ops"));
        assert_eq!(tested_stem("web/format.test.js").as_deref(), Some("format"));
        assert_eq!(tested_stem("calc/ops.py"), None);
        let py = imported_names("import os\nfrom calc.ops import divide\n");
        assert!(py.contains("ops") && py.contains("calc") && py.contains("os"));
        let rs = imported_names("use crate::lexer::Token;\n");
        assert!(rs.contains("lexer"));
        let js = imported_names("const f = require('./format');\nimport x from \"../util/strings\";\n");
        assert!(js.contains("format") && js.contains("strings"));
    }

    #[test]
    fn structure_lifts_the_related_file_over_text_matches() {
        let cand = |p: &str, c: &str| Candidate {
            path: p.into(),
            blob: String::new(),
            content: c.into(),
            embedding_similarity: 0.0,
        };
        let candidates = vec![
            cand(
                "tests/test_ops.py",
                "from calc.ops import divide\n\ndef test_divide():\n    assert divide(4, 2) == 2\n",
            ),
            cand("docs/zero.md", "zero zero zero division zero crashes zero"),
            cand("calc/util.py", "def clamp(x):\n    return x\n"),
        ];
        let changed = vec!["calc/ops.py".to_string()];
        let (no_content, no_cochange) = (HashMap::new(), HashMap::new());
        let q = Query {
            text: "division by zero crashes",
            changed: &changed,
            changed_content: &no_content,
            cochange: &no_cochange,
            use_paths: true,
        };
        let hybrid = order(&score(Ranker::Hybrid, &Weights::default(), features(&q, &candidates)), &candidates);
        assert_eq!(candidates[hybrid[0]].path, "tests/test_ops.py");
        let bm25 = order(&score(Ranker::Bm25, &Weights::default(), features(&q, &candidates)), &candidates);
        assert_eq!(candidates[bm25[0]].path, "docs/zero.md", "text alone prefers the word match");
    }
}
