//! Ranking the files of a repository that a PR did not change by how relevant they are to it.
//!
//! Text alone is a weak signal (embedding whole files loses to BM25), so the ranker adds what
//! the task gives for free: the changed paths, the repository's history and its code's
//! structure. Every feature is a row of the `features!` table below ([`Feature`]): its name
//! (the weight's key in `config/curation.toml`, the column of `--features-out`), what it
//! measures, and its starting weight.
//!
//! Each feature is scaled to [0, 1] over the candidates and combined with the weights of the
//! curation config. `Ranker::Bm25` is the baseline: BM25 alone.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::bm25::Bm25;
use super::imports::{self, Target};

use Feature as F;

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

/// The features of the ranker, in the order of the feature vector: variant, name, starting
/// weight (`config/curation.toml`'s, fitted on pallets/flask and pallets/click), what it
/// measures. [`Feature`], [`FEATURES`], [`NF`] and [`Weights`] are made from this one table.
macro_rules! features {
    ($($variant:ident $name:ident $weight:literal $doc:literal,)*) => {
        /// A feature of a candidate: its index in the feature vector (`x[i][F::Bm25 as usize]`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Feature {
            $(#[doc = $doc] $variant,)*
        }

        /// Features in all.
        pub const NF: usize = [$(Feature::$variant,)*].len();
        impl Feature {
            /// Every feature, in vector order.
            pub const ALL: [Feature; NF] = [$(Feature::$variant,)*];
            /// Its name: the key of its weight and its `--features-out` column.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Feature::$variant => stringify!($name),)*
                }
            }
            /// What it measures.
            pub const fn doc(self) -> &'static str {
                match self {
                    $(Feature::$variant => $doc,)*
                }
            }
        }

        /// Weights of the hybrid ranker (documented in `config/curation.toml`): the starting
        /// point, and the ranker itself until the lake holds enough earlier PRs to learn them from.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Weights {
            $(#[doc = $doc] pub $name: f64,)*
        }

        impl Default for Weights {
            /// The values of `config/curation.toml`.
            fn default() -> Self {
                Weights { $($name: $weight,)* }
            }
        }

        impl Weights {
            /// The weights in vector order.
            pub fn to_array(&self) -> [f64; NF] {
                [$(self.$name,)*]
            }
        }
    };
}

features! {
    Bm25 bm25 1.21 "BM25 (identifier-aware) of the PR/issue text and the changed paths against the candidate's path and first 8,000 characters.",
    Bm25Text bm25_text 0.75 "BM25 of the text alone.",
    PathTerms path_terms 0.76 "Terms of the changed paths in the candidate's path.",
    Imports imports 0.53 "It imports a changed file, or a changed file imports it (resolved to paths).",
    ImportNames import_names 0.03 "Module-name imports between it and the changed files, for languages whose imports are not resolved.",
    Tests tests 0.35 "It is the test of a changed module, or the module a changed test tests.",
    Cochange cochange 0.19 "How often it changed together with the changed files in earlier PRs.",
    CochangeRecent cochange_recent 0.45 "The same, each earlier PR counting half every 60 PRs.",
    Prior prior -0.48 "How often it changed at all in earlier PRs (decayed).",
    SameDir same_dir 0.17 "It sits in a directory of a changed file.",
    SymbolsText symbols_text 0.62 "Its definitions named in the text, rarer names counting more.",
    SymbolsChanged symbols_changed 0.64 "Its definitions used by the changed files.",
    KindMissing kind_missing 0.65 "It is a test and no test is among the visible files, or code and no code is.",
    SimilarChanges similar_changes 0.98 "The 20 earlier PRs whose text reads most alike changed it.",
    Embedding embedding 0.75 "MiniLM similarity of the text to its chunk closest to the query (the re-ranking stage only).",
    CochangeConf cochange_conf 0.42 "The largest share of a changed file's earlier PRs that also changed it.",
    CochangeConfSum cochange_conf_sum 0.58 "The sum of those shares over the changed files.",
    Callers callers 0.74 "Its uses of the changed files' definitions.",
    NamedInText named_in_text 0.59 "Its file name (stem) appears in the text.",
    RecentTouch recent_touch 0.42 "How lately it changed (halved every 8 PRs).",
    DirShare dir_share 0.39 "The share of its directory's files that the PR changed.",
    Bm25Full bm25_full 0.62 "BM25 over the whole file, not only its head.",
}

/// Feature names in vector order (the columns of `--features-out`, the keys of learned models).
pub const FEATURES: [&str; NF] = {
    let mut out = [""; NF];
    let mut i = 0;
    while i < NF {
        out[i] = Feature::ALL[i].name();
        i += 1;
    }
    out
};
/// The feature that needs the encoder (computed only for the candidates that reach re-ranking).
pub const EMBEDDING: usize = Feature::Embedding as usize;

/// The features as a Markdown table (name, starting weight, what it measures): the table of
/// `docs/curation.md`, which a test keeps equal to this.
pub fn feature_table() -> String {
    let w = Weights::default().to_array();
    let mut out = String::from("| feature | starting weight | what it measures |\n|---|---|---|\n");
    for f in Feature::ALL {
        out.push_str(&format!("| `{}` | {} | {} |\n", f.name(), w[f as usize], f.doc()));
    }
    out
}
/// Earlier changes whose text is most like the query's that vote for the files they changed.
const SIMILAR_CHANGES: usize = 20;
/// Changes after which an earlier change counts half for `recent_touch` (files in current work).
const RECENT_HALF_LIFE: f64 = 8.0;
/// Changes after which an earlier change counts half (co-change and prior decay).
const HALF_LIFE_CHANGES: f64 = 60.0;

/// A linear model over the scaled features: the config's weights or weights learned from the
/// lake's earlier PRs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    pub weights: [f64; NF],
    /// Leave-one-out cases it was fitted on (0: the config's weights).
    pub fitted_on: usize,
}

impl Model {
    pub fn from_config(w: &Weights) -> Model {
        Model { weights: w.to_array(), fitted_on: 0 }
    }

    /// `name=weight` pairs of the non-zero weights, for `pr_relevant_files.model`.
    pub fn describe(&self) -> String {
        let ws: Vec<String> =
            FEATURES.iter().zip(self.weights).filter(|(_, w)| *w != 0.0).map(|(n, w)| format!("{n}={w:.3}")).collect();
        let how = if self.fitted_on > 0 { format!("learned on {} cases", self.fitted_on) } else { "config".into() };
        format!("{how}: {}", ws.join(","))
    }

    /// The score of one candidate's scaled features; `with_embedding` false leaves it out
    /// (the first, cheap stage).
    pub fn score(&self, x: &[f64; NF], with_embedding: bool) -> f64 {
        (0..NF).filter(|&j| with_embedding || j != EMBEDDING).map(|j| self.weights[j] * x[j]).sum()
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

/// An earlier change of the repository: the paths it changed and its text (counted once).
#[derive(Debug, Clone)]
pub struct Earlier {
    pub files: Vec<String>,
    /// (old, new) paths it renamed: the files of still earlier changes go by the new names.
    pub renames: Vec<(String, String)>,
    terms: Arc<HashMap<String, u32>>,
    len: f64,
}

impl Earlier {
    pub fn new(files: Vec<String>, text: &str) -> Earlier {
        let (terms, len) = Bm25::term_counts(text);
        Earlier { files, renames: Vec::new(), terms: Arc::new(terms), len }
    }

    pub fn with_renames(mut self, renames: Vec<(String, String)>) -> Earlier {
        self.renames = renames;
        self
    }
}

/// The files of each change of `history` by their names after the last change: a module
/// moved to `src/` keeps the co-changes it had before the move.
fn current_names(history: &[Earlier]) -> Vec<Vec<String>> {
    let mut later: HashMap<String, String> = HashMap::new();
    let mut out: Vec<Vec<String>> = vec![Vec::new(); history.len()];
    for (k, e) in history.iter().enumerate().rev() {
        let mut files: Vec<String> =
            e.files.iter().map(|p| later.get(p).cloned().unwrap_or_else(|| p.clone())).collect();
        files.sort();
        files.dedup();
        out[k] = files;
        for (old, new) in &e.renames {
            let fin = later.get(new).cloned().unwrap_or_else(|| new.clone());
            later.insert(old.clone(), fin);
        }
    }
    out
}

/// What the ranker knows about the PR.
pub struct Query<'a> {
    /// Issue and PR text.
    pub text: &'a str,
    /// Paths the PR changed (visible to the ranker).
    pub changed: &'a [String],
    /// Contents of the changed files at the merge base (for their imports), by path.
    pub changed_content: &'a HashMap<String, std::sync::Arc<str>>,
    /// The repository's earlier changes, oldest first.
    pub history: &'a [Earlier],
    /// Use the changed paths at all (false for the text-only variant).
    pub use_paths: bool,
}

fn stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name).to_lowercase()
}

/// A test file: under a test directory or named as a test.
fn is_test(path: &str) -> bool {
    crate::testfiles::in_test_dir(path) || tested_stem(path).is_some()
}

fn dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// A test's name and a module's that share a stem without being equal: `test_loader` and
/// `loaders.py`, `test_async` and `asyncsupport.py`, `test_lexnparse` and `parser.py`. The
/// shorter name's stem (all but its last two letters, at least four) is inside the longer.
fn names_match(test: &str, module: &str) -> bool {
    let inside = |short: &str, long: &str| {
        let keep = short.len().saturating_sub(2).max(4);
        short.len() >= 4
            && short.is_char_boundary(keep.min(short.len()))
            && long.contains(&short[..keep.min(short.len())])
    };
    test != module && (inside(module, test) || inside(test, module))
}

/// The stem a test file tests (`test_foo`, `foo_test`, `foo.test`, `FooTest`, `foo.spec`, or
/// `foo` in a test directory: `jinja2/testsuite/filters.py`).
fn tested_stem(path: &str) -> Option<String> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let base = name.split('.').next().unwrap_or(name);
    let lower = base.to_lowercase();
    let in_test_dir = path
        .split('/')
        .rev()
        .skip(1)
        .any(|seg| matches!(seg, "test" | "tests" | "testing" | "testsuite" | "__tests__" | "spec"));
    let is_test_name = name.contains(".test.")
        || name.contains(".spec.")
        || (in_test_dir && !lower.starts_with("__") && lower != "conftest");
    // Fixtures (`conftest.py`) and package files (`__init__.py`) test no module of their name.
    if lower == "conftest" || lower.starts_with("__") {
        return None;
    }
    if let Some(s) = lower.strip_prefix("test_") {
        return Some(s.to_string());
    }
    for suffix in ["_test", "_tests", "_spec"] {
        if let Some(s) = lower.strip_suffix(suffix).filter(|s| !s.is_empty()) {
            return Some(s.trim_end_matches('_').to_string());
        }
    }
    // Without a separator only the camel-case form (`OpsTest.java`) is a test name: lower-case
    // words merely end so (`latest.py`, `manifest.py`).
    for suffix in ["Test", "Tests", "Spec"] {
        if let Some(s) = base.strip_suffix(suffix).filter(|s| !s.is_empty()) {
            return Some(s.to_lowercase());
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

/// Names a file defines (functions, methods, classes, types), lower-cased: the symbols an
/// issue or a changed file may mention.
pub fn definitions(content: &str) -> Vec<String> {
    const KEYWORDS: [&str; 11] =
        ["def ", "class ", "fn ", "func ", "function ", "struct ", "enum ", "trait ", "interface ", "type ", "impl "];
    let mut out = Vec::new();
    for line in content.lines() {
        let mut l = line.trim_start();
        for p in [
            "pub(crate) ",
            "pub ",
            "export ",
            "async ",
            "public ",
            "private ",
            "protected ",
            "static ",
            "abstract ",
            "final ",
        ] {
            l = l.strip_prefix(p).unwrap_or(l);
        }
        if let Some(rest) = KEYWORDS.iter().find_map(|k| l.strip_prefix(k)) {
            // Go methods: `func (r *T) Name(`.
            let rest =
                if rest.starts_with('(') { rest.split_once(')').map_or(rest, |(_, r)| r.trim_start()) } else { rest };
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name.len() >= 4 && !name.starts_with("__") {
                out.push(name.to_lowercase());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Identifiers of a text, lower-cased (whole identifiers, not their parts).
pub fn identifiers(text: &str) -> HashSet<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.len() >= 4)
        .map(|w| w.to_lowercase())
        .collect()
}

/// What the ranker reads from a candidate's content, computed once per (path, blob): a
/// repository's files are candidates of many PRs.
pub struct FileFacts {
    pub terms: Arc<HashMap<String, u32>>,
    pub len: f64,
    pub defs: Vec<String>,
    pub imports: Vec<Target>,
    pub import_names: HashSet<String>,
    /// Identifiers the file uses (whole file): a caller of a changed definition names it.
    pub ids: HashSet<String>,
    /// Terms of the whole file (the BM25 above reads its head only).
    pub full_terms: Arc<HashMap<String, u32>>,
    pub full_len: f64,
}

impl FileFacts {
    pub fn new(path: &str, content: &str) -> FileFacts {
        let head: String = content.chars().take(8000).collect();
        // The path twice: a file named after the topic is as telling as a paragraph about it.
        let (terms, len) = Bm25::term_counts(&format!("{path} {path} {head}"));
        let (full_terms, full_len) = Bm25::term_counts(&format!("{path} {path} {content}"));
        FileFacts {
            full_terms: Arc::new(full_terms),
            full_len,
            terms: Arc::new(terms),
            len,
            defs: definitions(content),
            imports: imports::targets(path, content),
            import_names: imported_names(content),
            ids: identifiers(content),
        }
    }
}

/// [`FileFacts`] by (path, blob), shared by the threads ranking a fit's cases (a pure function).
#[derive(Default)]
pub struct FactsCache {
    by_key: std::sync::Mutex<HashMap<(String, String), Arc<FileFacts>>>,
}

impl FactsCache {
    pub fn get(&self, c: &Candidate) -> Arc<FileFacts> {
        let key = (c.path.clone(), c.blob.clone());
        if let Some(f) = self.by_key.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return f.clone();
        }
        let f = Arc::new(FileFacts::new(&c.path, &c.content));
        self.by_key.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_insert(f).clone()
    }
}

fn scale(v: &mut [[f64; NF]], j: usize) {
    let max = v.iter().map(|x| x[j]).fold(0.0f64, f64::max);
    if max > 0.0 {
        v.iter_mut().for_each(|x| x[j] /= max);
    }
}

/// Feature values of every candidate, each scaled to [0, 1] over the candidates (the
/// embedding from [`Candidate::embedding_similarity`], 0 where not filled). The raw BM25
/// scores come back too: the baseline ranks by them.
pub fn features(q: &Query, candidates: &[Candidate], facts: &FactsCache) -> (Vec<[f64; NF]>, Vec<f64>) {
    let n = candidates.len();
    let f: Vec<Arc<FileFacts>> = candidates.iter().map(|c| facts.get(c)).collect();
    let bm = Bm25::from_counts(f.iter().map(|x| (x.terms.clone(), x.len)).collect());
    let query = if q.use_paths { format!("{} {}", q.text, q.changed.join(" ")) } else { q.text.to_string() };
    let bm25 = bm.scores(&query);
    let bm25_text = if q.use_paths { bm.scores(q.text) } else { bm25.clone() };
    let full = Bm25::from_counts(f.iter().map(|x| (x.full_terms.clone(), x.full_len)).collect()).scores(&query);
    let mut x = vec![[0.0; NF]; n];
    for i in 0..n {
        x[i][F::Bm25 as usize] = bm25[i];
        x[i][F::Bm25Text as usize] = bm25_text[i];
        x[i][F::Bm25Full as usize] = full[i];
    }

    // Symbols: a definition named in the text (or used by a changed file) points at its
    // file, the more so the fewer files define that name.
    let mut df: HashMap<&str, f64> = HashMap::new();
    for d in f.iter().flat_map(|x| x.defs.iter()) {
        *df.entry(d.as_str()).or_default() += 1.0;
    }
    let text_ids = identifiers(q.text);
    for i in 0..n {
        x[i][F::SymbolsText as usize] =
            f[i].defs.iter().filter(|d| text_ids.contains(*d)).map(|d| 1.0 / df[d.as_str()]).sum();
        let s = stem(&candidates[i].path);
        x[i][F::NamedInText as usize] = f64::from(u8::from(s.len() >= 4 && text_ids.contains(&s)));
    }

    let history_files = if q.history.iter().any(|e| !e.renames.is_empty()) {
        current_names(q.history)
    } else {
        q.history.iter().map(|e| e.files.clone()).collect()
    };
    // Earlier changes that read like this one vote for the files they changed (bug reports
    // resemble earlier reports about the same code).
    if !q.history.is_empty() {
        let past = Bm25::from_counts(q.history.iter().map(|e| (e.terms.clone(), e.len)).collect());
        let mut sim: Vec<(f64, usize)> =
            past.scores(q.text).into_iter().enumerate().filter(|(_, s)| *s > 0.0).map(|(k, s)| (s, k)).collect();
        sim.sort_by(|a, b| b.0.total_cmp(&a.0));
        let by_path: HashMap<&str, usize> = candidates.iter().enumerate().map(|(i, c)| (c.path.as_str(), i)).collect();
        for (score, k) in sim.into_iter().take(SIMILAR_CHANGES) {
            for p in &history_files[k] {
                if let Some(&i) = by_path.get(p.as_str()) {
                    x[i][F::SimilarChanges as usize] += score;
                }
            }
        }
    }

    if q.use_paths {
        let changed_stems: HashSet<String> = q.changed.iter().map(|p| stem(p)).collect();
        let changed_dirs: HashSet<&str> = q.changed.iter().map(|p| dir(p)).collect();
        let changed_tested: HashSet<String> = q.changed.iter().filter_map(|p| tested_stem(p)).collect();
        let changed_names: HashSet<String> = q.changed_content.values().flat_map(|c| imported_names(c)).collect();
        let changed_ids: HashSet<String> = q.changed_content.values().flat_map(|c| identifiers(c)).collect();

        // Imports resolved against the tree, both ways.
        let cand_index = imports::PathIndex::new(candidates.iter().map(|c| c.path.as_str()));
        let changed_index = imports::PathIndex::new(q.changed.iter().map(|p| p.as_str()));
        let by_path: HashMap<&str, usize> = candidates.iter().enumerate().map(|(i, c)| (c.path.as_str(), i)).collect();
        let mut imported_by_changed = vec![false; n];
        for (p, content) in q.changed_content {
            for t in imports::targets(p, content) {
                for hit in cand_index.resolve(&t) {
                    imported_by_changed[by_path[hit]] = true;
                }
            }
        }

        // Co-change, raw and decayed by age, and how often each file changed at all.
        let changed_set: HashSet<&String> = q.changed.iter().collect();
        let mut co: HashMap<&str, f64> = HashMap::new();
        let mut co_recent: HashMap<&str, f64> = HashMap::new();
        let mut prior: HashMap<&str, f64> = HashMap::new();
        let mut recent: HashMap<&str, f64> = HashMap::new();
        // Per visible file: how often it changed, and how often each other file changed with
        // it (decayed): P(candidate | that file changed), which a hub file does not inflate.
        let mut n_changed: HashMap<&str, f64> = HashMap::new();
        let mut pair: HashMap<(&str, &str), f64> = HashMap::new();
        let h = q.history.len();
        for (k, files) in history_files.iter().enumerate() {
            let decay = 0.5f64.powf((h - k) as f64 / HALF_LIFE_CHANGES);
            let fresh = 0.5f64.powf((h - k) as f64 / RECENT_HALF_LIFE);
            let touched: Vec<&str> = files.iter().filter(|p| changed_set.contains(p)).map(|p| p.as_str()).collect();
            for v in &touched {
                *n_changed.entry(v).or_default() += decay;
            }
            for p in files {
                *prior.entry(p.as_str()).or_default() += decay;
                *recent.entry(p.as_str()).or_default() += fresh;
                if !touched.is_empty() && !changed_set.contains(p) {
                    *co.entry(p.as_str()).or_default() += 1.0;
                    *co_recent.entry(p.as_str()).or_default() += decay;
                    for v in &touched {
                        *pair.entry((p.as_str(), v)).or_default() += decay;
                    }
                }
            }
        }
        // Callers: a candidate that uses a name a visible file defines, the more so the fewer
        // candidates use it.
        // Sorted: the feature is a sum over these names, and its bits must not follow hash order.
        let changed_defs: BTreeSet<String> = q.changed_content.values().flat_map(|c| definitions(c)).collect();
        let users: Vec<(&str, f64)> = changed_defs
            .iter()
            .map(|d| (d.as_str(), f.iter().filter(|x| x.ids.contains(d)).count() as f64))
            .filter(|(_, k)| *k > 0.0)
            .collect();

        // A PR that changes code and its tests shows one of them when the other is hidden: a
        // candidate of the kind (test or not) that no visible code file is, fills the gap.
        let visible_code: Vec<&String> = q.changed.iter().filter(|p| crate::lang::language(p).is_some()).collect();
        let has_tests = visible_code.iter().any(|p| is_test(p));
        let has_source = visible_code.iter().any(|p| !is_test(p));

        // A change that touched most files of a directory (a sweep over examples/, a rename
        // of every module) likely touched the rest: the share of each directory it changed.
        let mut dir_changed: HashMap<&str, f64> = HashMap::new();
        for p in q.changed {
            *dir_changed.entry(dir(p)).or_default() += 1.0;
        }
        let mut dir_unchanged: HashMap<&str, f64> = HashMap::new();
        for c in candidates {
            *dir_unchanged.entry(dir(&c.path)).or_default() += 1.0;
        }

        let paths = Bm25::new(candidates.iter().map(|c| c.path.as_str()));
        let path_terms = paths.scores(&q.changed.join(" "));
        for (i, c) in candidates.iter().enumerate() {
            let s = stem(&c.path);
            x[i][F::PathTerms as usize] = path_terms[i];
            let imports_changed = f[i].imports.iter().any(|t| !changed_index.resolve(t).is_empty());
            x[i][F::Imports as usize] =
                f64::from(u8::from(imports_changed)) + f64::from(u8::from(imported_by_changed[i]));
            let names_changed = f[i].import_names.iter().any(|n| changed_stems.contains(n));
            x[i][F::ImportNames as usize] =
                f64::from(u8::from(names_changed)) + f64::from(u8::from(changed_names.contains(&s)));
            let is_test_of_changed = tested_stem(&c.path).is_some_and(|t| changed_stems.contains(&t));
            x[i][F::Tests as usize] = if is_test_of_changed || changed_tested.contains(&s) {
                1.0
            } else {
                let fuzzy = match tested_stem(&c.path) {
                    Some(t) => changed_stems.iter().any(|m| names_match(&t, m)),
                    None => changed_tested.iter().any(|t| names_match(t, &s)),
                };
                if fuzzy {
                    0.5
                } else {
                    0.0
                }
            };
            x[i][F::Cochange as usize] = co.get(c.path.as_str()).copied().unwrap_or(0.0);
            x[i][F::CochangeRecent as usize] = co_recent.get(c.path.as_str()).copied().unwrap_or(0.0);
            x[i][F::Prior as usize] = prior.get(c.path.as_str()).copied().unwrap_or(0.0);
            x[i][F::SameDir as usize] = f64::from(u8::from(changed_dirs.contains(dir(&c.path))));
            x[i][F::SymbolsChanged as usize] =
                f[i].defs.iter().filter(|d| changed_ids.contains(*d)).map(|d| 1.0 / df[d.as_str()]).sum();
            x[i][F::KindMissing as usize] =
                f64::from(u8::from(if is_test(&c.path) { !has_tests } else { !has_source }));
            let mut conf_max = 0.0f64;
            let mut conf_sum = 0.0f64;
            for v in q.changed.iter().map(String::as_str) {
                if let Some(co) = pair.get(&(c.path.as_str(), v)) {
                    let conf = co / (n_changed.get(v).copied().unwrap_or(0.0) + 1.0);
                    conf_max = conf_max.max(conf);
                    conf_sum += conf;
                }
            }
            x[i][F::CochangeConf as usize] = conf_max;
            x[i][F::CochangeConfSum as usize] = conf_sum;
            x[i][F::Callers as usize] =
                users.iter().filter(|(d, _)| f[i].ids.contains(*d)).map(|(_, k)| 1.0 / k).sum::<f64>();
            x[i][F::RecentTouch as usize] = recent.get(c.path.as_str()).copied().unwrap_or(0.0);
            let d = dir(&c.path);
            let done = dir_changed.get(d).copied().unwrap_or(0.0);
            x[i][F::DirShare as usize] = done / (done + dir_unchanged[d]);
        }
    }
    for (i, c) in candidates.iter().enumerate() {
        // Similarities of unrelated text sit around 0.1-0.3 for this model: spread the top.
        x[i][EMBEDDING] = f64::from(c.embedding_similarity - 0.15).max(0.0);
    }
    for j in 0..NF {
        scale(&mut x, j);
    }
    (x, bm25)
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
    fn the_feature_table_is_the_config_and_the_docs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let config: toml::Table = std::fs::read_to_string(root.join("config/curation.toml")).unwrap().parse().unwrap();
        let weights = config["relevance"]["weights"].as_table().unwrap();
        let keys: Vec<&str> = weights.keys().map(String::as_str).collect();
        let mut names = FEATURES.to_vec();
        names.sort();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, names, "config/curation.toml [relevance.weights]");
        let defaults = Weights::default().to_array();
        for f in Feature::ALL {
            assert_eq!(weights[f.name()].as_float(), Some(defaults[f as usize]), "{}", f.name());
            assert_eq!(FEATURES[f as usize], f.name());
        }
        let docs = std::fs::read_to_string(root.join("docs/curation.md")).unwrap();
        assert!(docs.contains(&feature_table()), "docs/curation.md's feature table is not:\n{}", feature_table());
    }

    fn cand(p: &str, c: &str) -> Candidate {
        Candidate { path: p.into(), blob: p.into(), content: c.into(), embedding_similarity: 0.0 }
    }

    #[test]
    fn test_and_import_relations() {
        assert_eq!(tested_stem("tests/test_ops.py").as_deref(), Some("ops"));
        assert_eq!(tested_stem("pkg/ops_test.go").as_deref(), Some("ops"));
        assert_eq!(tested_stem("src/OpsTest.java").as_deref(), Some("ops"));
        assert_eq!(tested_stem("web/format.test.js").as_deref(), Some("format"));
        assert_eq!(tested_stem("calc/ops.py"), None);
        // The old layout of pallets/jinja: tests named after their module inside a test package.
        assert_eq!(tested_stem("jinja2/testsuite/filters.py").as_deref(), Some("filters"));
        assert_eq!(tested_stem("tests/res/__init__.py"), None);
        assert_eq!(tested_stem("tests/conftest.py"), None);
        assert_eq!(tested_stem("pkg/latest.py"), None);
        assert_eq!(tested_stem("tests/latest.py").as_deref(), Some("latest"));
        assert!(names_match("loader", "loaders") && names_match("async", "asyncsupport"));
        assert!(names_match("lexnparse", "parser") && !names_match("api", "environment"));
        assert!(!names_match("filters", "filters"), "equal names are the exact match, not this one");
        let py = imported_names("import os\nfrom calc.ops import divide\n");
        assert!(py.contains("ops") && py.contains("calc") && py.contains("os"));
        let rs = imported_names("use crate::lexer::Token;\n");
        assert!(rs.contains("lexer"));
        let js = imported_names("const f = require('./format');\nimport x from \"../util/strings\";\n");
        assert!(js.contains("format") && js.contains("strings"));
    }

    #[test]
    fn structure_lifts_the_related_file_over_text_matches() {
        let candidates = vec![
            cand(
                "tests/test_ops.py",
                "from calc.ops import divide\n\ndef test_divide():\n    assert divide(4, 2) == 2\n",
            ),
            cand("docs/zero.md", "zero zero zero division zero crashes zero"),
            cand("calc/util.py", "def clamp(x):\n    return x\n"),
        ];
        let changed = vec!["calc/ops.py".to_string()];
        let no_content = HashMap::new();
        let q = Query {
            text: "division by zero crashes",
            changed: &changed,
            changed_content: &no_content,
            history: &[],
            use_paths: true,
        };
        let facts = FactsCache::default();
        let (x, bm25) = features(&q, &candidates, &facts);
        let model = Model::from_config(&Weights::default());
        let hybrid: Vec<f64> = x.iter().map(|v| model.score(v, false)).collect();
        assert_eq!(candidates[order(&hybrid, &candidates)[0]].path, "tests/test_ops.py");
        assert_eq!(candidates[order(&bm25, &candidates)[0]].path, "docs/zero.md", "text alone prefers the word match");
    }

    #[test]
    fn definitions_and_history_features() {
        let defs = definitions("class Map:\n    def bind_to_environ(self):\n        pass\n    def __init__(self): ...\nfunc (r *Router) Handle() {}\npub fn parse_expr() {}\n");
        assert_eq!(defs, vec!["bind_to_environ", "handle", "parse_expr"]);
        let candidates = vec![
            cand("src/app/map.py", "class Map:\n    def bind_to_environ(self):\n        pass\n"),
            cand("src/app/old.py", "x = 1\n"),
            cand("src/app/new.py", "y = 2\n"),
        ];
        let changed = vec!["src/app/rules.py".to_string()];
        // old.py changed with rules.py long ago, new.py recently: the same raw co-change, more
        // recent weight for new.py.
        let mut history = vec![Earlier::new(vec!["src/app/rules.py".into(), "src/app/old.py".into()], "old")];
        history.extend((0..200).map(|i| Earlier::new(vec![format!("docs/{i}.md")], "docs")));
        history.push(Earlier::new(vec!["src/app/rules.py".into(), "src/app/new.py".into()], "binding fails"));
        let content: HashMap<String, Arc<str>> =
            [("src/app/rules.py".to_string(), Arc::from("from .map import Map\nMap().bind_to_environ()\n"))].into();
        let q = Query {
            text: "bind_to_environ fails",
            changed: &changed,
            changed_content: &content,
            history: &history,
            use_paths: true,
        };
        let (x, _) = features(&q, &candidates, &FactsCache::default());
        let f = |name: &str| FEATURES.iter().position(|n| *n == name).unwrap();
        assert_eq!(x[0][f("symbols_text")], 1.0);
        assert_eq!(x[0][f("symbols_changed")], 1.0);
        assert_eq!(x[0][f("imports")], 1.0, "rules.py imports map.py (resolved)");
        assert_eq!(x[1][f("imports")], 0.0);
        assert_eq!(x[1][f("cochange")], x[2][f("cochange")]);
        assert!(x[2][f("cochange_recent")] > 10.0 * x[1][f("cochange_recent")]);
        // The one earlier change whose text shares a word ("fails") changed new.py.
        assert_eq!((x[1][f("similar_changes")], x[2][f("similar_changes")]), (0.0, 1.0)); // P(candidate | rules.py changed): each of old.py and new.py changed in one of rules.py's
                                                                                          // two earlier changes, new.py more recently.
        assert!(x[2][f("cochange_conf")] == 1.0 && x[1][f("cochange_conf")] > 0.0);
        // map.py uses no name rules.py defines; old.py and new.py none either.
        assert_eq!(x[0][f("callers")], 0.0);
    }

    #[test]
    fn callers_and_directory_sweeps() {
        let candidates = vec![
            cand(
                "app/views.py",
                "from .forms import validate_login
validate_login(request)
",
            ),
            cand(
                "app/models.py",
                "class User:
    pass
",
            ),
            cand(
                "examples/c.py",
                "print('c')
",
            ),
        ];
        let changed = vec!["app/forms.py".to_string(), "examples/a.py".to_string(), "examples/b.py".to_string()];
        let content: HashMap<String, Arc<str>> = [(
            "app/forms.py".to_string(),
            Arc::from(
                "def validate_login(r):
    return r
",
            ),
        )]
        .into();
        let q = Query { text: "login", changed: &changed, changed_content: &content, history: &[], use_paths: true };
        let (x, _) = features(&q, &candidates, &FactsCache::default());
        let f = |name: &str| FEATURES.iter().position(|n| *n == name).unwrap();
        assert_eq!((x[0][f("callers")], x[1][f("callers")]), (1.0, 0.0), "views.py calls validate_login");
        // examples/: 2 of its 3 files changed; app/: 1 of 3.
        assert_eq!(x[2][f("dir_share")], 1.0);
        assert!((x[0][f("dir_share")] - 0.5).abs() < 1e-9, "{}", x[0][f("dir_share")]);
    }
}
