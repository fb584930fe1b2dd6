//! Relevant-but-unchanged files: for each kept PR, the files of its repository at the merge
//! base that it did not change, ranked (see [`rank`]), top k into `pr_relevant_files`. A
//! prompt that shows only the files that must change teaches a model to edit whatever it
//! is shown; relevant files are the distractors that make it choose.
//!
//! Embeddings are cached per blob in `blob_embeddings` (a file shared by many PRs is embedded
//! once) and the contents of the chosen files are added to the lake's blob store
//! (`file_blobs`), so the seed stage reads only the lake. [`evaluate`] measures rankers leave-one-out on a lake or on any git
//! repository's history.

pub(crate) mod bm25;
pub mod encoder;
pub mod rank;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Float32Builder, Float64Array, Int64Array, ListBuilder, RecordBatch, StringArray};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::git::{self, Mirrors};
use crate::lake::blobs::{self, BlobRow};
use crate::lake::Lake;
use encoder::Encoder;
use rank::{Candidate, Query, Ranker};

pub const PR_RELEVANT_FILES: &str = "pr_relevant_files";
pub const BLOB_EMBEDDINGS: &str = "blob_embeddings";
/// The tables the stage writes (and the blob store, for the contents of the files it ranks).
pub const OUTPUTS: [&str; 3] = [PR_RELEVANT_FILES, BLOB_EMBEDDINGS, blobs::FILE_BLOBS];
/// Its unit of work: a PR.
pub const PARTITION_KEY: &str = "pr";

const PRS_SQL: &str = include_str!("../../sql/relevance_prs.sql");
const FILES_SQL: &str = include_str!("../../sql/relevance_files.sql");
const EVAL_CHANGES_SQL: &str = include_str!("../../sql/relevance_eval_changes.sql");

/// The `[relevance]` section of the curation config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelevanceConfig {
    pub top_k: usize,
    pub ranker: Ranker,
    pub max_candidate_bytes: usize,
    pub chunk_chars: usize,
    pub max_chunks: usize,
    pub weights: rank::Weights,
}

impl Default for RelevanceConfig {
    fn default() -> Self {
        crate::config::default_section("relevance")
    }
}

/// Settings of a relevance run.
#[derive(Debug, Clone)]
pub struct RelevanceOptions {
    /// Where the repositories are (the mirrors are shared with the snapshots).
    pub mirrors: Mirrors,
    pub config: RelevanceConfig,
    /// Rank again PRs that already have relevant files.
    pub force: bool,
    pub threads: usize,
    pub show_progress: bool,
}

/// Embeddings of file chunks by blob, loaded from and saved to `blob_embeddings`.
#[derive(Default)]
pub struct EmbeddingCache {
    by_blob: HashMap<String, Arc<Vec<Vec<f32>>>>,
    new: Vec<(String, Arc<Vec<Vec<f32>>>)>,
    /// Texts embedded in this process, for throughput figures.
    pub embedded_texts: usize,
    pub embed_seconds: f64,
}

/// Chunks of a file for embedding: about `chars` characters each, cut at line ends, each
/// headed by the path; at most `max` of them.
pub fn chunks(path: &str, content: &str, chars: usize, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in content.lines() {
        if cur.len() + line.len() > chars && !cur.is_empty() {
            out.push(format!("{path}\n{cur}"));
            cur.clear();
            if out.len() == max {
                return out;
            }
        }
        let take: String = line.chars().take(chars).collect();
        cur.push_str(&take);
        cur.push('\n');
    }
    if !cur.trim().is_empty() || out.is_empty() {
        out.push(format!("{path}\n{cur}"));
    }
    out.truncate(max);
    out
}

impl EmbeddingCache {
    pub async fn load(lake: &Lake, model: &str) -> Result<EmbeddingCache> {
        let mut c = EmbeddingCache::default();
        if !lake.has_table(BLOB_EMBEDDINGS).await? {
            return Ok(c);
        }
        let ctx = lake.session().await?;
        let q = format!(
            "SELECT blob_sha, vector FROM {BLOB_EMBEDDINGS} WHERE model = '{}' ORDER BY blob_sha, chunk",
            model.replace('\'', "''")
        );
        let mut grouped: BTreeMap<String, Vec<Vec<f32>>> = BTreeMap::new();
        for (sha, vector) in crate::query::rows::<(String, Vec<f32>)>(&ctx, &q).await? {
            grouped.entry(sha).or_default().push(vector);
        }
        c.by_blob = grouped.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        Ok(c)
    }

    /// Makes sure every candidate's chunks are embedded (in batches), caching by blob.
    pub fn ensure(&mut self, enc: &Encoder, candidates: &[Candidate], cfg: &RelevanceConfig) -> Result<()> {
        let mut todo: Vec<(usize, Vec<String>)> = Vec::new();
        let mut seen = HashSet::new();
        for (i, c) in candidates.iter().enumerate() {
            if !self.by_blob.contains_key(&c.blob) && seen.insert(c.blob.clone()) {
                todo.push((i, chunks(&c.path, &c.content, cfg.chunk_chars, cfg.max_chunks)));
            }
        }
        let texts: Vec<&str> = todo.iter().flat_map(|(_, ch)| ch.iter().map(|s| s.as_str())).collect();
        let t = Instant::now();
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(32) {
            vectors.extend(enc.embed(batch)?);
        }
        self.embed_seconds += t.elapsed().as_secs_f64();
        self.embedded_texts += texts.len();
        let mut it = vectors.into_iter();
        for (i, ch) in todo {
            let v: Vec<Vec<f32>> = it.by_ref().take(ch.len()).collect();
            let v = Arc::new(v);
            self.by_blob.insert(candidates[i].blob.clone(), v.clone());
            self.new.push((candidates[i].blob.clone(), v));
        }
        Ok(())
    }

    /// Best chunk similarity of each candidate to `query`.
    pub fn fill_similarity(&self, candidates: &mut [Candidate], query: &[f32]) {
        for c in candidates.iter_mut() {
            c.embedding_similarity = self
                .by_blob
                .get(&c.blob)
                .map_or(0.0, |v| v.iter().map(|x| encoder::cosine(x, query)).fold(f32::MIN, f32::max));
        }
    }

    fn take_new_batch(&mut self, model: &str) -> Result<Option<RecordBatch>> {
        if self.new.is_empty() {
            return Ok(None);
        }
        let mut sha = Vec::new();
        let mut chunk = Vec::new();
        let mut list = ListBuilder::new(Float32Builder::new());
        for (blob, vecs) in self.new.drain(..) {
            for (i, v) in vecs.iter().enumerate() {
                sha.push(blob.clone());
                chunk.push(i as i64);
                list.values().append_slice(v);
                list.append(true);
            }
        }
        let n = sha.len();
        Ok(Some(RecordBatch::try_new(
            crate::schema::arrow(BLOB_EMBEDDINGS)?,
            vec![
                Arc::new(StringArray::from(sha)) as ArrayRef,
                Arc::new(StringArray::from(vec![model; n])),
                Arc::new(Int64Array::from(chunk)),
                Arc::new(list.finish()),
            ],
        )?))
    }
}

/// Code files of `commit` other than `exclude`, with their contents, as candidates.
pub fn candidates(
    repo: &Repository,
    commit: Oid,
    exclude: &HashSet<String>,
    max_bytes: usize,
) -> Result<Vec<Candidate>> {
    let files = git::tree_files(repo, commit).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
    let mut out = Vec::new();
    for (path, oid, size) in files {
        if size > max_bytes || exclude.contains(&path) || crate::lang::language(&path).is_none() {
            continue;
        }
        let (bytes, binary) = git::read_blob(repo, oid).map_err(|f| anyhow::anyhow!(f.message))?;
        if binary {
            continue;
        }
        let content: Arc<str> = String::from_utf8_lossy(&bytes).into();
        out.push(Candidate { path, blob: oid.to_string(), content, embedding_similarity: 0.0 });
    }
    Ok(out)
}

/// Per candidate path: earlier changes that touched it together with one of `changed`.
pub fn cochange(history: &[Vec<String>], changed: &[String]) -> HashMap<String, f64> {
    let changed: HashSet<&String> = changed.iter().collect();
    let mut out: HashMap<String, f64> = HashMap::new();
    for files in history {
        if files.iter().any(|f| changed.contains(f)) {
            for f in files {
                if !changed.contains(f) {
                    *out.entry(f.clone()).or_default() += 1.0;
                }
            }
        }
    }
    out
}

/// Everything needed to rank the candidates of one change.
pub struct Change<'a> {
    pub text: String,
    pub changed: Vec<String>,
    pub changed_content: HashMap<String, Arc<str>>,
    pub history: &'a [Vec<String>],
}

/// Ranks `candidates` for `change` (embedding similarities must be filled for hybrid).
pub fn rank_change(
    change: &Change,
    candidates: &[Candidate],
    ranker: Ranker,
    weights: &rank::Weights,
    use_paths: bool,
) -> Vec<(usize, f64)> {
    let co = cochange(change.history, &change.changed);
    let q = Query {
        text: &change.text,
        changed: &change.changed,
        changed_content: &change.changed_content,
        cochange: &co,
        use_paths,
    };
    let scores = rank::score(ranker, weights, rank::features(&q, candidates));
    rank::order(&scores, candidates).into_iter().map(|i| (i, scores[i])).collect()
}

/// The text of a query: issue and PR text, and for path-aware rankers the changed paths.
pub fn query_text(change: &Change, use_paths: bool) -> String {
    if use_paths {
        format!("{}\n{}", change.text, change.changed.join("\n"))
    } else {
        change.text.clone()
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RelevanceSummary {
    pub prs: usize,
    pub prs_already_done: usize,
    pub rows: usize,
    pub candidates: usize,
    pub embedded_chunks: usize,
    pub encoder_chunks_per_second: f64,
    pub failures: BTreeMap<String, usize>,
}

/// A kept PR to rank (a row of `sql/relevance_prs.sql`).
#[derive(Debug, Deserialize)]
struct PrToRank {
    repo_name: String,
    pr_number: i64,
    merge_base: String,
    text: String,
    merged_at: Option<i64>,
}

/// A changed file of a snapshotted PR (a row of `sql/relevance_files.sql`).
#[derive(Debug, Deserialize)]
struct ChangedFile {
    repo_name: String,
    pr_number: i64,
    path: String,
    old_path: Option<String>,
    merged_at: Option<i64>,
}

/// Per repository: the PRs to rank, their changed files (path, old path) and the history of
/// changes (merge time, PR, paths).
#[derive(Default)]
struct Work {
    prs: Vec<PrToRank>,
    changed: HashMap<i64, Vec<(String, Option<String>)>>,
    history: Vec<(i64, i64, Vec<String>)>,
}

async fn load_work(lake: &Lake, force: bool) -> Result<(BTreeMap<String, Work>, usize)> {
    // Issue text when the lake has the link and issue tables (filters may run without them).
    let ctx = lake.session_with(&["pr_issue_links", "issues"]).await?;
    let done: HashSet<(String, i64)> = if lake.has_table(PR_RELEVANT_FILES).await? && !force {
        crate::query::rows(&ctx, &format!("SELECT DISTINCT repo_name, pr_number FROM {PR_RELEVANT_FILES}"))
            .await?
            .into_iter()
            .collect()
    } else {
        HashSet::new()
    };
    let mut work: BTreeMap<String, Work> = BTreeMap::new();
    let mut already = 0;
    for pr in crate::query::rows::<PrToRank>(&ctx, PRS_SQL).await.context("sql/relevance_prs.sql")? {
        if done.contains(&(pr.repo_name.clone(), pr.pr_number)) {
            already += 1;
            continue;
        }
        work.entry(pr.repo_name.clone()).or_default().prs.push(pr);
    }
    let mut hist: HashMap<(String, i64), (i64, Vec<String>)> = HashMap::new();
    for f in crate::query::rows::<ChangedFile>(&ctx, FILES_SQL).await.context("sql/relevance_files.sql")? {
        let e = hist.entry((f.repo_name.clone(), f.pr_number)).or_insert((f.merged_at.unwrap_or(0), Vec::new()));
        e.1.push(f.path.clone());
        if let Some(o) = &f.old_path {
            e.1.push(o.clone());
        }
        if let Some(w) = work.get_mut(&f.repo_name) {
            w.changed.entry(f.pr_number).or_default().push((f.path, f.old_path));
        }
    }
    for ((repo, num), (t, files)) in hist {
        if let Some(w) = work.get_mut(&repo) {
            w.history.push((t, num, files));
        }
    }
    Ok((work, already))
}

/// Ranks the relevant files of every kept, snapshotted PR not ranked yet.
pub async fn run(lake: &Lake, opts: &RelevanceOptions) -> Result<RelevanceSummary> {
    let mut summary = RelevanceSummary::default();
    for t in ["pr_quality", "pr_snapshots", "pull_requests", "pr_files"] {
        if !lake.has_table(t).await? {
            anyhow::bail!("no `{t}` table yet: run the filters and snapshots jobs first");
        }
    }
    let (work, already) = load_work(lake, opts.force).await?;
    summary.prs_already_done = already;
    if work.is_empty() {
        return Ok(summary);
    }
    let mut cfg = opts.config.clone();
    let enc = if cfg.ranker == Ranker::Hybrid {
        match Encoder::load(opts.threads) {
            Ok(e) => Some(e),
            Err(e) => {
                // Without the model (first run offline, no python3/pip) rank with BM25 and say so.
                tracing::warn!(error = %format!("{e:#}"), "the MiniLM encoder is unavailable; ranking with BM25");
                summary.failures.insert("encoder_unavailable_used_bm25".into(), 1);
                cfg.ranker = Ranker::Bm25;
                None
            }
        }
    } else {
        None
    };
    let model = format!("{}+{}", cfg.ranker.name(), enc.as_ref().map_or("none", |e| e.name));
    let mut cache = EmbeddingCache::load(lake, encoder::MODEL_NAME).await?;
    let mut rows: Vec<RelevantFile> = Vec::new();
    let mut blobs: Vec<BlobRow> = Vec::new();
    let mut redo: Vec<(String, i64)> = Vec::new();
    for (repo_name, mut w) in work {
        let repo = match opts.mirrors.open(&repo_name) {
            Ok(r) => r,
            Err(f) => {
                *summary.failures.entry(f.reason.to_string()).or_default() += w.prs.len();
                continue;
            }
        };
        w.history.sort();
        for pr in &w.prs {
            let (num, text, t) = (&pr.pr_number, &pr.text, &pr.merged_at.unwrap_or(0));
            let Ok(base) = Oid::from_str(&pr.merge_base) else { continue };
            let changed_pairs = w.changed.get(num).cloned().unwrap_or_default();
            let mut exclude: HashSet<String> = HashSet::new();
            let mut visible = Vec::new();
            let mut changed_content = HashMap::new();
            for (p, old) in &changed_pairs {
                exclude.insert(p.clone());
                visible.push(p.clone());
                if let Some(o) = old {
                    exclude.insert(o.clone());
                }
            }
            let mut cands = match candidates(&repo, base, &exclude, cfg.max_candidate_bytes) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(repo = %repo_name, pr = num, error = %e, "cannot list candidates");
                    *summary.failures.entry("candidates_failed".into()).or_default() += 1;
                    continue;
                }
            };
            // Contents of the changed files at the merge base, for their imports.
            if let Ok(files) = git::tree_files(&repo, base) {
                let wanted: HashSet<&String> = changed_pairs.iter().map(|(p, o)| o.as_ref().unwrap_or(p)).collect();
                for (p, oid, _) in files.into_iter().filter(|(p, _, _)| wanted.contains(p)) {
                    if let Ok((b, false)) = git::read_blob(&repo, oid) {
                        changed_content.insert(p, String::from_utf8_lossy(&b).into());
                    }
                }
            }
            let history: Vec<Vec<String>> = w
                .history
                .iter()
                .filter(|(ht, hn, _)| ht < t || (ht == t && hn < num))
                .map(|(_, _, f)| f.clone())
                .collect();
            let change = Change { text: text.clone(), changed: visible, changed_content, history: &history };
            if let Some(enc) = &enc {
                cache.ensure(enc, &cands, &cfg)?;
                let q = enc.embed(&[&query_text(&change, true)])?.remove(0);
                cache.fill_similarity(&mut cands, &q);
            }
            summary.candidates += cands.len();
            let ranked = rank_change(&change, &cands, cfg.ranker, &cfg.weights, true);
            for (rank, (i, score)) in ranked.into_iter().take(cfg.top_k).enumerate() {
                let c = &cands[i];
                rows.push(RelevantFile {
                    repo_name: repo_name.clone(),
                    pr_number: *num,
                    rank: rank + 1,
                    path: c.path.clone(),
                    blob_sha: c.blob.clone(),
                    score,
                    model: model.clone(),
                });
                blobs.push(BlobRow {
                    sha: c.blob.clone(),
                    size: c.content.len(),
                    is_binary: false,
                    content: Some(c.content.as_bytes().to_vec()),
                });
            }
            redo.push((repo_name.clone(), *num));
            summary.prs += 1;
        }
    }
    summary.rows = rows.len();
    summary.embedded_chunks = cache.embedded_texts;
    summary.encoder_chunks_per_second =
        if cache.embed_seconds > 0.0 { cache.embedded_texts as f64 / cache.embed_seconds } else { 0.0 };

    // Write: old rows of these PRs out, new rows in; new embeddings; contents of new blobs.
    if opts.force && lake.has_table(PR_RELEVANT_FILES).await? {
        for (repo, num) in &redo {
            lake.delete_where(
                PR_RELEVANT_FILES,
                &format!("repo_name = '{}' AND pr_number = {num}", repo.replace('\'', "''")),
            )
            .await?;
        }
    }
    // The cache and the blobs first, the PRs' rows last: a PR with rows is done, so a run that
    // stops before them redoes the PRs (from the cache) and loses nothing.
    if let Some(b) = cache.take_new_batch(encoder::MODEL_NAME)? {
        let t = lake.ensure_contract_table(BLOB_EMBEDDINGS).await?;
        lake.append(t, vec![b]).await?;
    }
    blobs::insert_absent(lake, blobs).await?;
    if !rows.is_empty() {
        let batch = relevant_files_batch(&rows)?;
        let t = lake.ensure_contract_table(PR_RELEVANT_FILES).await?;
        lake.append(t, vec![batch]).await?;
    }
    Ok(summary)
}

/// One row of `pr_relevant_files`.
struct RelevantFile {
    repo_name: String,
    pr_number: i64,
    rank: usize,
    path: String,
    blob_sha: String,
    score: f64,
    model: String,
}

fn relevant_files_batch(rows: &[RelevantFile]) -> Result<RecordBatch> {
    let strs =
        |f: &dyn Fn(&RelevantFile) -> &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(rows.iter().map(f))) };
    Ok(RecordBatch::try_new(
        crate::schema::arrow(PR_RELEVANT_FILES)?,
        vec![
            strs(&|r| &r.repo_name),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.pr_number))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.rank as i64))),
            strs(&|r| &r.path),
            strs(&|r| &r.blob_sha),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.score))),
            strs(&|r| &r.model),
        ],
    )?)
}

/// One leave-one-out case: a change with one of its files hidden among the candidates.
struct EvalCase {
    text: String,
    visible: Vec<String>,
    hidden: String,
    base: Oid,
    history: Vec<Vec<String>>,
    changed_content: HashMap<String, Arc<str>>,
}

/// Recall@k of the rankers (and their text-only variants) over leave-one-out cases.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EvalReport {
    pub cases: usize,
    /// ranker -> (recall@1, recall@5, recall@10)
    pub recall: BTreeMap<String, [f64; 3]>,
    pub encoder_files_per_second: f64,
    pub candidates_per_case: f64,
}

impl EvalReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} leave-one-out cases, {:.0} candidates each on average\n\n",
            self.cases, self.candidates_per_case
        );
        s.push_str(&format!("{:<28} {:>9} {:>9} {:>10}\n", "ranker", "recall@1", "recall@5", "recall@10"));
        for (name, r) in &self.recall {
            s.push_str(&format!("{name:<28} {:>9.3} {:>9.3} {:>10.3}\n", r[0], r[1], r[2]));
        }
        s.push_str(&format!("\nencoder: {:.1} files/s (chunks embedded per second)\n", self.encoder_files_per_second));
        s
    }
}

fn eval_cases_for_change(
    repo: &Repository,
    base: Oid,
    text: &str,
    changed: &[String],
    history: &[Vec<String>],
    out: &mut Vec<EvalCase>,
) -> Result<()> {
    let at_base: HashSet<String> =
        git::tree_files(repo, base).map_err(|f| anyhow::anyhow!(f.message))?.into_iter().map(|(p, _, _)| p).collect();
    // Hide only code files that exist at the base (an added file is not a candidate).
    let code: Vec<&String> = changed.iter().filter(|p| crate::lang::language(p).is_some()).collect();
    if code.len() < 2 {
        return Ok(());
    }
    for hidden in code.iter().filter(|p| at_base.contains(**p)) {
        let visible: Vec<String> = changed.iter().filter(|p| p != hidden).cloned().collect();
        let mut changed_content = HashMap::new();
        for (p, oid, _) in git::tree_files(repo, base).map_err(|f| anyhow::anyhow!(f.message))? {
            if visible.contains(&p) {
                if let Ok((b, false)) = git::read_blob(repo, oid) {
                    changed_content.insert(p, String::from_utf8_lossy(&b).into());
                }
            }
        }
        out.push(EvalCase {
            text: text.to_string(),
            visible,
            hidden: (*hidden).clone(),
            base,
            history: history.to_vec(),
            changed_content,
        });
    }
    Ok(())
}

/// Leave-one-out cases from a git repository's first-parent history: every commit that
/// changes two or more code files is a change, its message the text.
pub fn cases_from_repo(repo: &Repository, max_commits: usize) -> Result<Vec<(Oid, String, Vec<String>)>> {
    let mut walk = repo.revwalk()?;
    walk.push_head()?;
    walk.simplify_first_parent()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    let mut out = Vec::new();
    for oid in walk.take(max_commits) {
        let c = repo.find_commit(oid?)?;
        if c.parent_count() != 1 {
            continue;
        }
        let parent = c.parent(0)?;
        let diff = repo.diff_tree_to_tree(Some(&parent.tree()?), Some(&c.tree()?), None)?;
        let files: Vec<String> = diff
            .deltas()
            .filter_map(|d| d.old_file().path().or(d.new_file().path()).map(|p| p.to_string_lossy().into_owned()))
            .collect();
        out.push((parent.id(), String::from_utf8_lossy(c.message_bytes()).into_owned(), files));
    }
    Ok(out)
}

/// Evaluates on changes `(base commit, text, changed paths)` of one repository, in time order.
pub fn evaluate(
    repo: &Repository,
    changes: &[(Oid, String, Vec<String>)],
    cfg: &RelevanceConfig,
    encoder: Option<&Encoder>,
) -> Result<EvalReport> {
    let mut cases = Vec::new();
    let mut history: Vec<Vec<String>> = Vec::new();
    for (base, text, files) in changes {
        eval_cases_for_change(repo, *base, text, files, &history, &mut cases)?;
        history.push(files.clone());
    }
    let mut report = EvalReport { cases: cases.len(), ..Default::default() };
    if cases.is_empty() {
        return Ok(report);
    }
    let mut hits: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    let mut cache = EmbeddingCache::default();
    let mut total_candidates = 0usize;
    for case in &cases {
        let exclude: HashSet<String> = case.visible.iter().cloned().collect();
        let mut cands = candidates(repo, case.base, &exclude, cfg.max_candidate_bytes)?;
        total_candidates += cands.len();
        let Some(target) = cands.iter().position(|c| c.path == case.hidden) else { continue };
        let change = Change {
            text: case.text.clone(),
            changed: case.visible.clone(),
            changed_content: case.changed_content.clone(),
            history: &case.history,
        };
        let mut variants: Vec<(String, Ranker, bool)> =
            vec![("bm25 (text + paths)".into(), Ranker::Bm25, true), ("bm25 (text only)".into(), Ranker::Bm25, false)];
        if let Some(enc) = encoder {
            cache.ensure(enc, &cands, cfg)?;
            variants.push(("hybrid (text + paths)".into(), Ranker::Hybrid, true));
            variants.push(("hybrid (text only)".into(), Ranker::Hybrid, false));
        }
        for (name, ranker, use_paths) in variants {
            if let (Some(enc), Ranker::Hybrid) = (encoder, ranker) {
                let q = enc.embed(&[&query_text(&change, use_paths)])?.remove(0);
                cache.fill_similarity(&mut cands, &q);
            }
            let ranked = rank_change(&change, &cands, ranker, &cfg.weights, use_paths);
            let pos = ranked.iter().position(|(i, _)| *i == target).unwrap_or(usize::MAX);
            let h = hits.entry(name).or_default();
            for (k, slot) in [1usize, 5, 10].iter().zip(h.iter_mut()) {
                if pos < *k {
                    *slot += 1;
                }
            }
        }
    }
    let n = cases.len() as f64;
    report.recall = hits.into_iter().map(|(k, h)| (k, [h[0] as f64 / n, h[1] as f64 / n, h[2] as f64 / n])).collect();
    report.encoder_files_per_second =
        if cache.embed_seconds > 0.0 { cache.embedded_texts as f64 / cache.embed_seconds } else { 0.0 };
    report.candidates_per_case = total_candidates as f64 / n;
    Ok(report)
}

/// Changes of one repository from a lake: merged, snapshotted PRs in time order.
pub async fn changes_from_lake(lake: &Lake, repo_name: &str) -> Result<Vec<(Oid, String, Vec<String>)>> {
    #[derive(Deserialize)]
    struct Row {
        merge_base: String,
        text: String,
        path: String,
        old_path: Option<String>,
        status: String,
    }
    let ctx = lake.session().await?;
    let repo =
        RecordBatch::try_from_iter(vec![("repo_name", Arc::new(StringArray::from(vec![repo_name])) as ArrayRef)])?;
    ctx.register_batch("eval_repo", repo)?;
    let mut out: Vec<(Oid, String, Vec<String>)> = Vec::new();
    for r in crate::query::rows::<Row>(&ctx, EVAL_CHANGES_SQL).await.context("sql/relevance_eval_changes.sql")? {
        let oid = Oid::from_str(&r.merge_base).with_context(|| format!("merge base {:?}", r.merge_base))?;
        // The file as it is at the base: the old path of renames; additions do not exist there.
        if r.status == "A" {
            continue;
        }
        let p = r.old_path.unwrap_or(r.path);
        match out.last_mut() {
            Some(last) if last.0 == oid && last.1 == r.text => last.2.push(p),
            _ => out.push((oid, r.text, vec![p])),
        }
    }
    Ok(out)
}
