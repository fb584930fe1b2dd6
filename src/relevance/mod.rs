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
pub mod imports;
pub mod learn;
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
use learn::Example;
use rank::{Candidate, Earlier, FactsCache, Model, Query, Ranker, EMBEDDING, FEATURES, NF};

pub const PR_RELEVANT_FILES: &str = "pr_relevant_files";
pub const BLOB_EMBEDDINGS: &str = "blob_embeddings";
pub const RELEVANCE_MODELS: &str = "relevance_models";
/// The tables the stage writes (and the blob store, for the contents of the files it ranks).
pub const OUTPUTS: [&str; 4] = [PR_RELEVANT_FILES, BLOB_EMBEDDINGS, blobs::FILE_BLOBS, RELEVANCE_MODELS];
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
    /// Chunks of a re-ranked file the encoder reads: those closest to the query by BM25
    /// (0: every chunk).
    pub embed_chunks: usize,
    /// Candidates of the cheap first stage that the encoder re-ranks.
    pub rerank: usize,
    /// Re-rank with the MiniLM encoder (false: the first stage alone; no model is fetched).
    pub encoder: bool,
    /// Learn the weights from the repository's earlier PRs (else the config's weights).
    pub learn: bool,
    /// Leave-one-out cases (the most recent) to learn from.
    pub train_cases: usize,
    /// Fewer cases than this: the config's weights.
    pub min_train_cases: usize,
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
    /// Only the repositories of this shard.
    pub shard: Option<crate::git::Shard>,
}

/// Embeddings of file chunks by blob and chunk index, loaded from and saved to
/// `blob_embeddings`: a chunk read for one PR is not embedded again for another.
#[derive(Default)]
pub struct EmbeddingCache {
    by_blob: HashMap<String, BTreeMap<u32, Arc<Vec<f32>>>>,
    new: Vec<(String, u32, Arc<Vec<f32>>)>,
    /// Texts embedded in this process, for throughput figures.
    pub embedded_texts: usize,
    pub embed_seconds: f64,
    /// Chunks asked for that were already embedded (in this process or an earlier run).
    pub chunk_hits: usize,
    pub chunk_misses: usize,
    /// Batch texts of similar length together (off: in file order, as before re-ranking).
    pub batch_by_length: bool,
    /// Keep the texts embedded (for benchmarks).
    pub keep_texts: bool,
    pub texts: Vec<String>,
}

/// Texts per encoder call.
const BATCH: usize = 32;

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

/// The chunks of a file the encoder reads for `query`, with their indexes: all of them when
/// `keep` is 0 or covers them, else the `keep` that BM25 (over the file's own chunks) finds
/// closest to the query, the earlier chunk first on a tie (so a file that shares nothing
/// with the query shows its head).
pub fn selected_chunks(path: &str, content: &str, query: &str, cfg: &RelevanceConfig) -> Vec<(u32, String)> {
    let all = chunks(path, content, cfg.chunk_chars, cfg.max_chunks);
    let keep = cfg.embed_chunks;
    if keep == 0 || all.len() <= keep {
        return all.into_iter().enumerate().map(|(i, t)| (i as u32, t)).collect();
    }
    let scores = bm25::Bm25::new(all.iter().map(String::as_str)).scores(query);
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(keep);
    order.sort_unstable();
    let mut all: Vec<Option<String>> = all.into_iter().map(Some).collect();
    order.into_iter().map(|i| (i as u32, all[i].take().unwrap_or_default())).collect()
}

impl EmbeddingCache {
    pub async fn load(lake: &Lake, model: &str) -> Result<EmbeddingCache> {
        let mut c = EmbeddingCache { batch_by_length: true, ..Default::default() };
        if !lake.has_table(BLOB_EMBEDDINGS).await? {
            return Ok(c);
        }
        let ctx = lake.session().await?;
        let q = format!(
            "SELECT blob_sha, chunk, vector FROM {BLOB_EMBEDDINGS} WHERE model = '{}'",
            model.replace('\'', "''")
        );
        for (sha, chunk, vector) in crate::query::rows::<(String, i64, Vec<f32>)>(&ctx, &q).await? {
            c.by_blob.entry(sha).or_default().insert(chunk as u32, Arc::new(vector));
        }
        Ok(c)
    }

    /// The best chunk similarity of each of `candidates` to the query (text `query`, vector
    /// `query_vector`), over the chunks [`selected_chunks`] picks for it; chunks not embedded
    /// yet are embedded, batched by length (a batch is padded to its longest text, and file
    /// chunks vary tenfold).
    pub fn similarities(
        &mut self,
        enc: &Encoder,
        candidates: &[&Candidate],
        query: &str,
        query_vector: &[f32],
        cfg: &RelevanceConfig,
    ) -> Result<Vec<f32>> {
        let mut wanted: Vec<Vec<u32>> = Vec::with_capacity(candidates.len());
        let mut todo: Vec<(String, u32, String)> = Vec::new();
        let mut queued: HashSet<(&str, u32)> = HashSet::new();
        for c in candidates {
            let picked = selected_chunks(&c.path, &c.content, query, cfg);
            let have = self.by_blob.get(&c.blob);
            let mut idx = Vec::with_capacity(picked.len());
            for (i, text) in picked {
                if have.is_some_and(|h| h.contains_key(&i)) || queued.contains(&(c.blob.as_str(), i)) {
                    self.chunk_hits += 1;
                } else {
                    self.chunk_misses += 1;
                    queued.insert((c.blob.as_str(), i));
                    todo.push((c.blob.clone(), i, text));
                }
                idx.push(i);
            }
            wanted.push(idx);
        }
        self.embed(enc, todo)?;
        Ok(candidates
            .iter()
            .zip(wanted)
            .map(|(c, idx)| {
                let have = self.by_blob.get(&c.blob);
                idx.iter()
                    .filter_map(|i| have.and_then(|h| h.get(i)))
                    .map(|v| encoder::cosine(v, query_vector))
                    .fold(0.0f32, f32::max)
            })
            .collect())
    }

    fn embed(&mut self, enc: &Encoder, todo: Vec<(String, u32, String)>) -> Result<()> {
        if todo.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let mut order: Vec<usize> = (0..todo.len()).collect();
        if self.batch_by_length {
            order.sort_by_key(|&i| todo[i].2.len());
        }
        if self.keep_texts {
            self.texts.extend(todo.iter().map(|t| t.2.clone()));
        }
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); todo.len()];
        for batch in order.chunks(BATCH) {
            let refs: Vec<&str> = batch.iter().map(|&i| todo[i].2.as_str()).collect();
            for (&i, v) in batch.iter().zip(enc.embed(&refs)?) {
                vectors[i] = v;
            }
        }
        self.embed_seconds += t.elapsed().as_secs_f64();
        self.embedded_texts += todo.len();
        for ((blob, chunk, _), v) in todo.into_iter().zip(vectors) {
            let v = Arc::new(v);
            self.by_blob.entry(blob.clone()).or_default().insert(chunk, v.clone());
            self.new.push((blob, chunk, v));
        }
        Ok(())
    }

    /// Share of chunk lookups answered from the cache.
    pub fn hit_rate(&self) -> f64 {
        let all = self.chunk_hits + self.chunk_misses;
        if all == 0 {
            0.0
        } else {
            self.chunk_hits as f64 / all as f64
        }
    }

    fn take_new_batch(&mut self, model: &str) -> Result<Option<RecordBatch>> {
        if self.new.is_empty() {
            return Ok(None);
        }
        let mut sha = Vec::new();
        let mut chunk = Vec::new();
        let mut list = ListBuilder::new(Float32Builder::new());
        for (blob, i, v) in self.new.drain(..) {
            sha.push(blob);
            chunk.push(i64::from(i));
            list.values().append_slice(&v);
            list.append(true);
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

/// Everything needed to rank the candidates of one change.
pub struct Change<'a> {
    pub text: String,
    pub changed: Vec<String>,
    pub changed_content: HashMap<String, Arc<str>>,
    /// The repository's earlier changes, oldest first.
    pub history: &'a [Earlier],
}

/// The text of a query: issue and PR text, and for path-aware rankers the changed paths.
pub fn query_text(change: &Change, use_paths: bool) -> String {
    if use_paths {
        format!("{}\n{}", change.text, change.changed.join("\n"))
    } else {
        change.text.clone()
    }
}

/// The two stages of a ranker: cheap features for every candidate, then the encoder for the
/// `rerank` best of them. A candidate outside those cannot enter the top k: the encoder runs
/// on a few dozen files per PR instead of a whole repository.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub ranker: Ranker,
    /// First stage: the weights without the embedding.
    pub cheap: Model,
    /// Second stage: all the weights, on the re-ranked candidates.
    pub full: Model,
    pub rerank: usize,
}

impl Pipeline {
    pub fn from_config(cfg: &RelevanceConfig) -> Pipeline {
        let full = Model::from_config(&cfg.weights);
        let mut cheap = full.clone();
        cheap.weights[EMBEDDING] = 0.0;
        Pipeline { ranker: cfg.ranker, cheap, full, rerank: cfg.rerank }
    }

    /// What `pr_relevant_files.model` records: ranker, encoder and weights.
    pub fn describe(&self, encoder: Option<&str>) -> String {
        let name = self.ranker.name();
        match (self.ranker, encoder) {
            (Ranker::Bm25, _) => format!("{name}+none"),
            (Ranker::Hybrid, None) => format!("{name}+none [{}]", self.cheap.describe()),
            (Ranker::Hybrid, Some(e)) => format!(
                "{name}+{e} [first stage {}; top {} re-ranked {}]",
                self.cheap.describe(),
                self.rerank,
                self.full.describe()
            ),
        }
    }
}

/// The encoder and its cache, for the second stage.
pub struct Embedder<'a> {
    pub encoder: &'a Encoder,
    pub cache: &'a mut EmbeddingCache,
    pub config: &'a RelevanceConfig,
}

/// A ranked change: candidate indexes best first with their scores, every candidate's
/// scaled features, and the candidates the encoder re-ranked.
pub struct Ranked {
    pub order: Vec<(usize, f64)>,
    pub x: Vec<[f64; NF]>,
    pub reranked: Vec<usize>,
}

/// Ranks `candidates` for `change`.
pub fn rank_change(
    change: &Change,
    candidates: &mut [Candidate],
    pipeline: &Pipeline,
    use_paths: bool,
    facts: &mut FactsCache,
    embedder: Option<&mut Embedder>,
) -> Result<Ranked> {
    candidates.iter_mut().for_each(|c| c.embedding_similarity = 0.0);
    let q = Query {
        text: &change.text,
        changed: &change.changed,
        changed_content: &change.changed_content,
        history: change.history,
        use_paths,
    };
    let (mut x, bm25) = rank::features(&q, candidates, facts);
    if pipeline.ranker == Ranker::Bm25 {
        let order = rank::order(&bm25, candidates).into_iter().map(|i| (i, bm25[i])).collect();
        return Ok(Ranked { order, x, reranked: Vec::new() });
    }
    let cheap: Vec<f64> = x.iter().map(|v| pipeline.cheap.score(v, false)).collect();
    let first = rank::order(&cheap, candidates);
    let Some(em) = embedder else {
        let order = first.into_iter().map(|i| (i, cheap[i])).collect();
        return Ok(Ranked { order, x, reranked: Vec::new() });
    };
    let top: Vec<usize> = first.iter().copied().take(pipeline.rerank).collect();
    let query = query_text(change, use_paths);
    let qv = em.encoder.embed(&[&query])?.remove(0);
    let top_cands: Vec<&Candidate> = top.iter().map(|&i| &candidates[i]).collect();
    let sims = em.cache.similarities(em.encoder, &top_cands, &query, &qv, em.config)?;
    let mut max = 0.0f64;
    for (&i, sim) in top.iter().zip(sims) {
        candidates[i].embedding_similarity = sim;
        // Similarities of unrelated text sit around 0.1-0.3 for this model: spread the top.
        x[i][EMBEDDING] = f64::from(sim - 0.15).max(0.0);
        max = max.max(x[i][EMBEDDING]);
    }
    if max > 0.0 {
        top.iter().for_each(|&i| x[i][EMBEDDING] /= max);
    }
    let full: Vec<f64> = top.iter().map(|&i| pipeline.full.score(&x[i], true)).collect();
    let mut by_full: Vec<usize> = (0..top.len()).collect();
    by_full.sort_by(|&a, &b| {
        full[b].total_cmp(&full[a]).then_with(|| candidates[top[a]].path.cmp(&candidates[top[b]].path))
    });
    let mut order: Vec<(usize, f64)> = by_full.iter().map(|&k| (top[k], full[k])).collect();
    order.extend(first.iter().skip(top.len()).map(|&i| (i, cheap[i])));
    Ok(Ranked { order, x, reranked: top })
}

/// Learns a ranker as PRs go by: examples of a PR join only after it is ranked, and the
/// weights are refitted on what came before — nothing a PR teaches ranks the PR itself.
pub struct Learner {
    pub pipeline: Pipeline,
    base: Pipeline,
    cheap: Vec<Example>,
    full: Vec<Example>,
    pending: Vec<(Example, Option<Example>)>,
    fitted_at: usize,
    min_cases: usize,
    max_cases: usize,
    pub fits: usize,
}

impl Learner {
    pub fn new(base: Pipeline, cfg: &RelevanceConfig) -> Learner {
        Learner {
            pipeline: base.clone(),
            base,
            cheap: Vec::new(),
            full: Vec::new(),
            pending: Vec::new(),
            fitted_at: 0,
            min_cases: cfg.min_train_cases.max(1),
            max_cases: cfg.train_cases.max(1),
            fits: 0,
        }
    }

    /// Records what a ranked case teaches (held back until [`Learner::end_pr`]).
    pub fn observe(&mut self, ranked: &Ranked, target: usize) {
        let cheap_x: Vec<[f64; NF]> = ranked
            .x
            .iter()
            .map(|v| {
                let mut v = *v;
                v[EMBEDDING] = 0.0;
                v
            })
            .collect();
        let cheap = Example { x: cheap_x, target };
        let full = ranked
            .reranked
            .iter()
            .position(|&i| i == target)
            .map(|t| Example { x: ranked.reranked.iter().map(|&i| ranked.x[i]).collect(), target: t });
        self.pending.push((cheap, full));
    }

    /// The PR's cases join the training set; refit when it has grown by a quarter.
    pub fn end_pr(&mut self) {
        for (c, f) in self.pending.drain(..) {
            self.cheap.push(c);
            self.full.extend(f);
        }
        let n = self.cheap.len();
        if n >= self.min_cases && (self.fitted_at == 0 || n * 4 >= self.fitted_at * 5) {
            self.refit();
        }
    }

    /// Like [`Learner::end_pr`] without refitting (one fit at the end).
    pub fn end_pr_without_fit(&mut self) {
        for (c, f) in self.pending.drain(..) {
            self.cheap.push(c);
            self.full.extend(f);
        }
    }

    /// Cases learned from so far.
    pub fn cases(&self) -> usize {
        self.cheap.len()
    }

    pub fn refit(&mut self) {
        let recent = |v: &[Example], k: usize| v[v.len().saturating_sub(k)..].to_vec();
        self.pipeline.cheap = learn::fit(&recent(&self.cheap, self.max_cases), false, &self.base.cheap);
        // The second stage is the first plus the embedding, with its weight learned once there
        // are enough re-ranked cases (until then the config's).
        let mut full = self.pipeline.cheap.clone();
        full.weights[EMBEDDING] = self.base.full.weights[EMBEDDING];
        self.pipeline.full = if self.full.len() >= self.min_cases {
            learn::fit_embedding(&recent(&self.full, self.max_cases), &full)
        } else {
            full
        };
        self.fitted_at = self.cheap.len();
        self.fits += 1;
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RelevanceSummary {
    /// Repositories ranked with the weights stored by an earlier run (no fit this run).
    pub fits_reused: usize,
    pub prs: usize,
    pub prs_already_done: usize,
    pub rows: usize,
    pub candidates: usize,
    pub embedded_chunks: usize,
    pub encoder_chunks_per_second: f64,
    /// Share of blob lookups the embedding cache answered (this run's and earlier runs').
    pub embedding_cache_hit_rate: f64,
    /// Leave-one-out cases the weights were learned from, and the time that took.
    pub training_cases: usize,
    pub fit_seconds: f64,
    /// Time spent ranking the PRs (after fitting).
    pub rank_seconds: f64,
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
    text: Option<String>,
    status: String,
}

/// Per repository: the PRs to rank, their changed files (path, old path) and the history of
/// changes (merge time, PR, paths).
#[derive(Default)]
struct Work {
    prs: Vec<PrToRank>,
    changed: HashMap<i64, Vec<(String, Option<String>)>>,
    history: Vec<(i64, i64, Earlier)>,
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
    type Hist = (i64, Vec<String>, String, Vec<(String, String)>);
    let mut hist: HashMap<(String, i64), Hist> = HashMap::new();
    for f in crate::query::rows::<ChangedFile>(&ctx, FILES_SQL).await.context("sql/relevance_files.sql")? {
        let e = hist
            .entry((f.repo_name.clone(), f.pr_number))
            .or_insert_with(|| (f.merged_at.unwrap_or(0), Vec::new(), f.text.clone().unwrap_or_default(), Vec::new()));
        e.1.push(f.path.clone());
        if let Some(o) = &f.old_path {
            e.1.push(o.clone());
            if f.status.starts_with('R') {
                e.3.push((o.clone(), f.path.clone()));
            }
        }
        if let Some(w) = work.get_mut(&f.repo_name) {
            w.changed.entry(f.pr_number).or_default().push((f.path, f.old_path));
        }
    }
    for ((repo, num), (t, files, text, renames)) in hist {
        if let Some(w) = work.get_mut(&repo) {
            w.history.push((t, num, Earlier::new(files, &text).with_renames(renames)));
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
    let (mut work, already) = load_work(lake, opts.force).await?;
    if let Some(s) = opts.shard {
        work.retain(|repo, _| s.owns(repo));
    }
    summary.prs_already_done = already;
    if work.is_empty() {
        return Ok(summary);
    }
    let cfg = opts.config.clone();
    let enc = if cfg.ranker == Ranker::Hybrid && cfg.encoder {
        match Encoder::load(opts.threads) {
            Ok(e) => Some(e),
            Err(e) => {
                // Without the model (first run offline, no python3/pip) rank with the first
                // stage alone (every feature but the embedding) and say so.
                tracing::warn!(error = %format!("{e:#}"), "the MiniLM encoder is unavailable; ranking without it");
                summary.failures.insert("encoder_unavailable_first_stage_only".into(), 1);
                None
            }
        }
    } else {
        None
    };
    let space = embedding_space(&cfg);
    let mut cache = EmbeddingCache::load(lake, &space).await?;
    let mut facts = FactsCache::default();
    let fingerprint = fit_fingerprint(&cfg, enc.as_ref().map(|e| e.name));
    let stored = if cfg.ranker == Ranker::Hybrid && cfg.learn { stored_fits(lake).await? } else { HashMap::new() };
    let mut new_fits: Vec<(String, StoredFit)> = Vec::new();
    let mut rows: Vec<RelevantFile> = Vec::new();
    let mut blobs: Vec<BlobRow> = Vec::new();
    let mut redo: Vec<(String, i64)> = Vec::new();
    for (repo_name, w) in work {
        let repo = match opts.mirrors.open(&repo_name) {
            Ok(r) => r,
            Err(f) => {
                *summary.failures.entry(f.reason.to_string()).or_default() += w.prs.len();
                continue;
            }
        };
        let ctx = RepoContext::new(&repo, &repo_name, w);
        let mut pipeline = Pipeline::from_config(&cfg);
        if cfg.ranker == Ranker::Hybrid && cfg.learn {
            let t = Instant::now();
            let changes = changes_from_lake(lake, &repo_name).await?;
            // The last fit serves until the history has grown by a quarter: an hourly run with
            // a few new PRs (or a --force re-rank) does not pay for a fit (minutes with the
            // encoder) each time. Another config, feature set or encoder fits again.
            let reusable = stored
                .get(&repo_name)
                .filter(|f| f.fingerprint == fingerprint && changes.len() * 4 < f.history_changes * 5);
            if let Some(f) = reusable {
                pipeline.cheap = f.cheap.clone();
                pipeline.full = f.full.clone();
                summary.fits_reused += 1;
            } else {
                let mut em = enc.as_ref().map(|e| Embedder { encoder: e, cache: &mut cache, config: &cfg });
                let (p, cases) = fit_on_history(&repo, &changes, pipeline, &cfg, &mut facts, em.as_mut())?;
                pipeline = p;
                summary.training_cases += cases;
                summary.fit_seconds += t.elapsed().as_secs_f64();
                if cases >= cfg.min_train_cases {
                    new_fits.push((
                        repo_name.clone(),
                        StoredFit {
                            fingerprint: fingerprint.clone(),
                            history_changes: changes.len(),
                            cheap: pipeline.cheap.clone(),
                            full: pipeline.full.clone(),
                        },
                    ));
                }
            }
        }
        let t = Instant::now();
        let ranked = rank_work(&ctx, &pipeline, &cfg, enc.as_ref(), &mut cache, &mut facts, &mut summary)?;
        for (num, files) in ranked {
            for f in files {
                blobs.push(BlobRow {
                    sha: f.blob_sha.clone(),
                    size: f.content.len(),
                    is_binary: false,
                    content: Some(f.content.as_bytes().to_vec()),
                });
                rows.push(f.row);
            }
            redo.push((repo_name.clone(), num));
        }
        summary.rank_seconds += t.elapsed().as_secs_f64();
    }
    summary.rows = rows.len();
    summary.embedded_chunks = cache.embedded_texts;
    summary.encoder_chunks_per_second =
        if cache.embed_seconds > 0.0 { cache.embedded_texts as f64 / cache.embed_seconds } else { 0.0 };
    summary.embedding_cache_hit_rate = cache.hit_rate();

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
    if let Some(b) = cache.take_new_batch(&space)? {
        // Insert-if-absent: a worker of another shard may have embedded the same blobs.
        let scope = format!("model = '{}'", space.replace('\'', "''"));
        lake.insert_absent(BLOB_EMBEDDINGS, &b, &["blob_sha", "chunk"], Some(&scope), &[]).await?;
    }
    blobs::insert_absent(lake, blobs).await?;
    store_fits(lake, new_fits).await?;
    if !rows.is_empty() {
        let batch = relevant_files_batch(&rows)?;
        let t = lake.ensure_contract_table(PR_RELEVANT_FILES).await?;
        lake.append(t, vec![batch]).await?;
    }
    Ok(summary)
}

/// Weights the job fitted for one repository, as `relevance_models` keeps them.
struct StoredFit {
    fingerprint: String,
    history_changes: usize,
    cheap: Model,
    full: Model,
}

/// What a fit depends on, hashed: the `[relevance]` section (but `top_k`, which only cuts the
/// ranking), the features and the encoder.
fn fit_fingerprint(cfg: &RelevanceConfig, encoder: Option<&str>) -> String {
    let cfg = RelevanceConfig { top_k: 0, ..cfg.clone() };
    let text = format!(
        "{}|{}|{}",
        serde_json::to_string(&cfg).unwrap_or_default(),
        FEATURES.join(","),
        encoder.unwrap_or("no encoder")
    );
    format!("{:016x}", crate::hash::fnv1a(text.bytes(), crate::hash::OFFSET))
}

/// The stored fits by repository (those whose features are this version's).
async fn stored_fits(lake: &Lake) -> Result<HashMap<String, StoredFit>> {
    if !lake.has_table(RELEVANCE_MODELS).await? {
        return Ok(HashMap::new());
    }
    type Row = (String, String, i64, i64, i64, Vec<String>, Vec<f64>, Vec<f64>);
    let ctx = lake.session().await?;
    let rows: Vec<Row> = crate::query::rows(
        &ctx,
        &format!(
            "SELECT repo_name, fingerprint, history_changes, training_cases, second_stage_cases, features, \
             first_stage, second_stage FROM {RELEVANCE_MODELS}"
        ),
    )
    .await?;
    let model = |w: &[f64], cases: i64| -> Option<Model> {
        Some(Model { weights: w.try_into().ok()?, fitted_on: cases.max(0) as usize })
    };
    Ok(rows
        .into_iter()
        .filter(|r| r.5.iter().map(String::as_str).eq(FEATURES))
        .filter_map(|(repo, fingerprint, history, cases, full_cases, _, cheap, full)| {
            let fit = StoredFit {
                fingerprint,
                history_changes: history.max(0) as usize,
                cheap: model(&cheap, cases)?,
                full: model(&full, full_cases)?,
            };
            Some((repo, fit))
        })
        .collect())
}

/// Upserts the new fits into `relevance_models`.
async fn store_fits(lake: &Lake, fits: Vec<(String, StoredFit)>) -> Result<()> {
    use arrow::array::{Float64Builder, StringBuilder, TimestampMicrosecondArray};
    if fits.is_empty() {
        return Ok(());
    }
    let schema = crate::schema::arrow(RELEVANCE_MODELS)?;
    let n = fits.len();
    let mut features = ListBuilder::new(StringBuilder::new());
    let mut cheap = ListBuilder::new(Float64Builder::new());
    let mut full = ListBuilder::new(Float64Builder::new());
    for (_, f) in &fits {
        for name in FEATURES {
            features.values().append_value(name);
        }
        features.append(true);
        cheap.values().append_slice(&f.cheap.weights);
        cheap.append(true);
        full.values().append_slice(&f.full.weights);
        full.append(true);
    }
    let now = chrono::Utc::now().timestamp_micros();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(fits.iter().map(|(r, _)| r.as_str()))),
        Arc::new(StringArray::from_iter_values(fits.iter().map(|(_, f)| f.fingerprint.as_str()))),
        Arc::new(Int64Array::from_iter_values(fits.iter().map(|(_, f)| f.history_changes as i64))),
        Arc::new(Int64Array::from_iter_values(fits.iter().map(|(_, f)| f.cheap.fitted_on as i64))),
        Arc::new(Int64Array::from_iter_values(fits.iter().map(|(_, f)| f.full.fitted_on as i64))),
        Arc::new(features.finish()),
        Arc::new(cheap.finish()),
        Arc::new(full.finish()),
        Arc::new(TimestampMicrosecondArray::from(vec![now; n]).with_timezone("UTC")),
    ];
    // The builders' lists are nullable; the contract's fields may not be: take its types.
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| Ok(arrow::compute::cast(c, f.data_type())?))
        .collect::<Result<Vec<_>>>()?;
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    lake.upsert_rows(RELEVANCE_MODELS, &schema, &[batch], &["repo_name".to_string()], None, "fits").await?;
    Ok(())
}

/// A repository's PRs to rank, with their changed files and the repository's history in
/// time order.
pub struct RepoContext<'r> {
    repo: &'r Repository,
    repo_name: String,
    work: Work,
    keys: Vec<(i64, i64)>,
    earlier: Vec<Earlier>,
}

impl<'r> RepoContext<'r> {
    fn new(repo: &'r Repository, repo_name: &str, mut work: Work) -> RepoContext<'r> {
        work.history.sort_by_key(|h| (h.0, h.1));
        let keys = work.history.iter().map(|h| (h.0, h.1)).collect();
        let earlier = work.history.iter().map(|h| h.2.clone()).collect();
        RepoContext { repo, repo_name: repo_name.to_string(), work, keys, earlier }
    }

    /// PRs to rank.
    pub fn prs(&self) -> usize {
        self.work.prs.len()
    }

    /// The PR's change as the ranker sees it, its base and the paths to exclude.
    fn change(&self, pr: &PrToRank) -> Option<(Oid, Change<'_>, HashSet<String>)> {
        let base = Oid::from_str(&pr.merge_base).ok()?;
        let changed_pairs = self.work.changed.get(&pr.pr_number).cloned().unwrap_or_default();
        let mut exclude: HashSet<String> = HashSet::new();
        let mut visible = Vec::new();
        for (p, old) in &changed_pairs {
            exclude.insert(p.clone());
            visible.push(p.clone());
            if let Some(o) = old {
                exclude.insert(o.clone());
            }
        }
        // Contents of the changed files at the merge base, for their imports.
        let wanted: Vec<String> = changed_pairs.iter().map(|(p, o)| o.clone().unwrap_or_else(|| p.clone())).collect();
        let changed_content = contents_at(self.repo, base, &wanted);
        let at = (pr.merged_at.unwrap_or(0), pr.pr_number);
        let history = &self.earlier[..self.keys.partition_point(|k| *k < at)];
        Some((base, Change { text: pr.text.clone(), changed: visible, changed_content, history }, exclude))
    }
}

/// A chosen file: its row and its content (for the blob store).
struct Chosen {
    row: RelevantFile,
    blob_sha: String,
    content: Arc<str>,
}

/// Ranks every PR of `ctx`: per PR, its top-k files.
fn rank_work(
    ctx: &RepoContext,
    pipeline: &Pipeline,
    cfg: &RelevanceConfig,
    enc: Option<&Encoder>,
    cache: &mut EmbeddingCache,
    facts: &mut FactsCache,
    summary: &mut RelevanceSummary,
) -> Result<Vec<(i64, Vec<Chosen>)>> {
    let model = pipeline.describe(enc.map(|e| e.name));
    let mut out = Vec::new();
    for pr in &ctx.work.prs {
        let num = pr.pr_number;
        let Some((base, change, exclude)) = ctx.change(pr) else { continue };
        let mut cands = match candidates(ctx.repo, base, &exclude, cfg.max_candidate_bytes) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(repo = %ctx.repo_name, pr = num, error = %e, "cannot list candidates");
                *summary.failures.entry("candidates_failed".into()).or_default() += 1;
                continue;
            }
        };
        summary.candidates += cands.len();
        let mut em = enc.map(|e| Embedder { encoder: e, cache: &mut *cache, config: cfg });
        let ranked = rank_change(&change, &mut cands, pipeline, true, facts, em.as_mut())?;
        let chosen = ranked
            .order
            .into_iter()
            .take(cfg.top_k)
            .enumerate()
            .map(|(rank, (i, score))| {
                let c = &cands[i];
                Chosen {
                    row: RelevantFile {
                        repo_name: ctx.repo_name.clone(),
                        pr_number: num,
                        rank: rank + 1,
                        path: c.path.clone(),
                        blob_sha: c.blob.clone(),
                        score,
                        model: model.clone(),
                    },
                    blob_sha: c.blob.clone(),
                    content: c.content.clone(),
                }
            })
            .collect();
        out.push((num, chosen));
        summary.prs += 1;
    }
    Ok(out)
}

/// Leave-one-out recall@1/5/10 on the PRs of `ctx`: each changed code file that exists at
/// the base hidden in turn, the PR's other files visible. Returns the hidden file's rank in
/// each case (`usize::MAX` when it is not ranked) and the recall.
fn loo_recall(
    ctx: &RepoContext,
    pipeline: &Pipeline,
    cfg: &RelevanceConfig,
    enc: Option<&Encoder>,
    cache: &mut EmbeddingCache,
    facts: &mut FactsCache,
) -> Result<(Vec<usize>, [f64; 3])> {
    let mut ranks = Vec::new();
    for pr in &ctx.work.prs {
        let Some((base, change, _)) = ctx.change(pr) else { continue };
        let all = candidates(ctx.repo, base, &HashSet::new(), cfg.max_candidate_bytes)?;
        let code: Vec<&String> = change.changed.iter().filter(|p| crate::lang::language(p).is_some()).collect();
        if code.len() < 2 {
            continue;
        }
        for hidden in code {
            let visible: Vec<String> = change.changed.iter().filter(|p| *p != hidden).cloned().collect();
            let mut cands: Vec<Candidate> = all.iter().filter(|c| !visible.contains(&c.path)).cloned().collect();
            let Some(target) = cands.iter().position(|c| &c.path == hidden) else { continue };
            let case = Change {
                text: change.text.clone(),
                changed: visible.clone(),
                changed_content: change
                    .changed_content
                    .iter()
                    .filter(|(p, _)| visible.contains(p))
                    .map(|(p, c)| (p.clone(), c.clone()))
                    .collect(),
                history: change.history,
            };
            let mut em = enc.map(|e| Embedder { encoder: e, cache: &mut *cache, config: cfg });
            let ranked = rank_change(&case, &mut cands, pipeline, true, facts, em.as_mut())?;
            let pos = ranked.order.iter().position(|(i, _)| *i == target).unwrap_or(usize::MAX);
            ranks.push(pos);
        }
    }
    let recall = recall_of(&ranks);
    Ok((ranks, recall))
}

/// Recall@1/5/10 of ranks (0: first).
pub fn recall_of(ranks: &[usize]) -> [f64; 3] {
    let n = ranks.len().max(1) as f64;
    [1usize, 5, 10].map(|k| ranks.iter().filter(|&&r| r < k).count() as f64 / n)
}

/// Two sides' ranks of the same cases compared: (cases where `now` ranks the hidden file
/// higher, lower, the same) and each side's mean reciprocal rank.
pub fn paired_ranks(before: &[usize], now: &[usize]) -> Option<((usize, usize, usize), f64, f64)> {
    if before.len() != now.len() || before.is_empty() {
        return None;
    }
    let mut counts = (0, 0, 0);
    for (b, n) in before.iter().zip(now) {
        match n.cmp(b) {
            std::cmp::Ordering::Less => counts.0 += 1,
            std::cmp::Ordering::Greater => counts.1 += 1,
            std::cmp::Ordering::Equal => counts.2 += 1,
        }
    }
    let mrr = |r: &[usize]| {
        r.iter().map(|&p| if p == usize::MAX { 0.0 } else { 1.0 / (p as f64 + 1.0) }).sum::<f64>() / r.len() as f64
    };
    Some((counts, mrr(before), mrr(now)))
}

/// What `blob_embeddings.model` records: the encoder, and the chunk size when it is not the
/// one the first lakes were made with (chunk `i` of a blob is other text at another size, so
/// vectors cached at one size are never read at another).
pub fn embedding_space(cfg: &RelevanceConfig) -> String {
    if cfg.chunk_chars == BEFORE_CHUNK_CHARS {
        encoder::MODEL_NAME.to_string()
    } else {
        format!("{}/chunk_chars={}", encoder::MODEL_NAME, cfg.chunk_chars)
    }
}

/// Chunking of the relevance stage before re-ranking (`bench relevance`'s baseline).
pub const BEFORE_CHUNK_CHARS: usize = 1500;
pub const BEFORE_MAX_CHUNKS: usize = 8;

/// One side of `swelake bench relevance`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSide {
    pub name: String,
    pub prs: usize,
    pub seconds: f64,
    pub prs_per_second: f64,
    pub embedded_chunks: usize,
    pub chunks_per_second: f64,
    pub embedding_cache_hit_rate: f64,
    pub loo_cases: usize,
    pub loo_recall: [f64; 3],
    /// The hidden file's rank (0: first) in each leave-one-out case, in the same case order
    /// on both sides: recall@k on a few dozen cases moves by a whole case when one rank
    /// crosses k, so the bench also compares the sides case by case.
    pub loo_ranks: Vec<usize>,
    /// The hidden file's rank in every leave-one-out case of the repository's merged PRs in
    /// the lake (as `eval-relevance` makes them), when asked for: the kept PRs give a few
    /// dozen cases, too few for a difference of one case to mean anything.
    pub every_case_ranks: Vec<usize>,
    /// The chunks this side embedded, tokenized (for the Python baseline).
    #[serde(skip)]
    pub chunk_texts: Vec<String>,
}

/// Ranks up to `prs` kept PRs of `repo_name` (spread over its history) the way the job did
/// before re-ranking (the encoder on every candidate, batches in file order) and the way it
/// does now (cheap first stage, the encoder on the top `rerank`, batches by length), each
/// from an empty embedding cache, then measures both sides' leave-one-out recall on them.
pub async fn bench_sides(
    lake: &Lake,
    repo: &Repository,
    repo_name: &str,
    prs: usize,
    cfg: &RelevanceConfig,
    enc: &Encoder,
    every_case: bool,
) -> Result<Vec<BenchSide>> {
    let every = if every_case {
        let changes = changes_from_lake(lake, repo_name).await?;
        Some(case_set(repo, &changes, 0)?)
    } else {
        None
    };
    let (mut work, _) = load_work(lake, true).await?;
    let mut w =
        work.remove(repo_name).with_context(|| format!("no kept, snapshotted PRs of {repo_name} in the lake"))?;
    if w.prs.len() > prs {
        let step = w.prs.len() as f64 / prs as f64;
        let picked: Vec<usize> = (0..prs).map(|i| (i as f64 * step) as usize).collect();
        let all = std::mem::take(&mut w.prs);
        w.prs = all.into_iter().enumerate().filter(|(i, _)| picked.contains(i)).map(|(_, p)| p).collect();
    }
    let ctx = RepoContext::new(repo, repo_name, w);
    let mut out = Vec::new();
    // The stage as it was, whatever the config's chunking now: every chunk of every
    // candidate, in chunks of 1,500 characters, at most 8 per file.
    let every_chunk = RelevanceConfig {
        embed_chunks: 0,
        chunk_chars: BEFORE_CHUNK_CHARS,
        max_chunks: BEFORE_MAX_CHUNKS,
        ..cfg.clone()
    };
    for (name, rerank, by_length, cfg) in [
        ("before: encoder on every candidate", usize::MAX, false, &every_chunk),
        ("now: cheap stage, encoder on the top", cfg.rerank, true, cfg),
    ] {
        let pipeline = Pipeline { rerank, ..Pipeline::from_config(cfg) };
        let mut cache = EmbeddingCache { batch_by_length: by_length, keep_texts: true, ..Default::default() };
        let mut facts = FactsCache::default();
        let mut summary = RelevanceSummary::default();
        let t = Instant::now();
        rank_work(&ctx, &pipeline, cfg, Some(enc), &mut cache, &mut facts, &mut summary)?;
        let seconds = t.elapsed().as_secs_f64();
        let (embedded, chunk_s, hit) =
            (cache.embedded_texts, cache.embedded_texts as f64 / cache.embed_seconds.max(1e-9), cache.hit_rate());
        let texts = std::mem::take(&mut cache.texts);
        let (loo_ranks, loo) = loo_recall(&ctx, &pipeline, cfg, Some(enc), &mut cache, &mut facts)?;
        let mut every_case_ranks = Vec::new();
        if let Some(set) = &every {
            for_each_case(
                repo,
                set,
                cfg,
                |_, change, cands, target| {
                    let mut em = Embedder { encoder: enc, cache: &mut cache, config: cfg };
                    let ranked = rank_change(change, cands, &pipeline, true, &mut facts, Some(&mut em))?;
                    every_case_ranks.push(ranked.order.iter().position(|(i, _)| *i == target).unwrap_or(usize::MAX));
                    Ok(())
                },
                || {},
            )?;
        }
        out.push(BenchSide {
            name: name.to_string(),
            prs: summary.prs,
            seconds,
            prs_per_second: summary.prs as f64 / seconds.max(1e-9),
            embedded_chunks: embedded,
            chunks_per_second: chunk_s,
            embedding_cache_hit_rate: hit,
            loo_cases: loo_ranks.len(),
            loo_recall: loo,
            loo_ranks,
            every_case_ranks,
            chunk_texts: texts,
        });
    }
    Ok(out)
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
    /// Index of its change (cases of one change share text and base).
    change: usize,
    text: String,
    visible: Vec<String>,
    hidden: String,
    base: Oid,
    /// How many earlier changes its history holds.
    history_len: usize,
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
    /// Share of blob lookups the embedding cache answered.
    pub embedding_cache_hit_rate: f64,
    /// Chunks the encoder embedded.
    pub embedded_chunks: usize,
    /// Learned rankers: how many times they were refitted and their last weights.
    pub learned: BTreeMap<String, LearnedSummary>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LearnedSummary {
    pub fits: usize,
    pub first_stage: BTreeMap<String, f64>,
    pub second_stage: BTreeMap<String, f64>,
}

impl EvalReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} leave-one-out cases, {:.0} candidates each on average\n\n",
            self.cases, self.candidates_per_case
        );
        s.push_str(&format!("{:<40} {:>9} {:>9} {:>10}\n", "ranker", "recall@1", "recall@5", "recall@10"));
        for (name, r) in &self.recall {
            s.push_str(&format!("{name:<40} {:>9.3} {:>9.3} {:>10.3}\n", r[0], r[1], r[2]));
        }
        for (name, l) in &self.learned {
            let w = |m: &BTreeMap<String, f64>| {
                m.iter().filter(|(_, v)| **v != 0.0).map(|(k, v)| format!("{k}={v:.2}")).collect::<Vec<_>>().join(" ")
            };
            s.push_str(&format!(
                "\n{name}: refitted {} times on earlier PRs only\n  first stage: {}\n",
                l.fits,
                w(&l.first_stage)
            ));
            if !l.second_stage.is_empty() {
                s.push_str(&format!("  re-ranking:  {}\n", w(&l.second_stage)));
            }
        }
        if self.embedded_chunks > 0 {
            s.push_str(&format!(
                "\nencoder: {} chunks, {:.1} chunks/s; embedding cache hit rate {:.1}%\n",
                self.embedded_chunks,
                self.encoder_files_per_second,
                100.0 * self.embedding_cache_hit_rate
            ));
        }
        s
    }
}

/// Contents of `paths` at `commit` (those that are text), by path.
fn contents_at(repo: &Repository, commit: Oid, paths: &[String]) -> HashMap<String, Arc<str>> {
    let mut out = HashMap::new();
    let Ok(files) = git::tree_files(repo, commit) else { return out };
    let wanted: HashSet<&String> = paths.iter().collect();
    for (p, oid, _) in files.into_iter().filter(|(p, _, _)| wanted.contains(p)) {
        if let Ok((b, false)) = git::read_blob(repo, oid) {
            out.insert(p, String::from_utf8_lossy(&b).into());
        }
    }
    out
}

fn eval_cases_for_change(
    repo: &Repository,
    change: usize,
    base: Oid,
    text: &str,
    changed: &[String],
    history_len: usize,
    out: &mut Vec<EvalCase>,
) -> Result<()> {
    let at_base: HashSet<String> =
        git::tree_files(repo, base).map_err(|f| anyhow::anyhow!(f.message))?.into_iter().map(|(p, _, _)| p).collect();
    // Hide only code files that exist at the base (an added file is not a candidate).
    let code: Vec<&String> = changed.iter().filter(|p| crate::lang::language(p).is_some()).collect();
    if code.len() < 2 {
        return Ok(());
    }
    let contents = contents_at(repo, base, changed);
    for hidden in code.iter().filter(|p| at_base.contains(**p)) {
        let visible: Vec<String> = changed.iter().filter(|p| p != hidden).cloned().collect();
        let changed_content =
            contents.iter().filter(|(p, _)| visible.contains(p)).map(|(p, c)| (p.clone(), c.clone())).collect();
        out.push(EvalCase {
            change,
            text: text.to_string(),
            visible,
            hidden: (*hidden).clone(),
            base,
            history_len,
            changed_content,
        });
    }
    Ok(())
}

/// Leave-one-out cases from a git repository's first-parent history: every commit that
/// changes two or more code files is a change, its message the text.
pub fn cases_from_repo(repo: &Repository, max_commits: usize) -> Result<Vec<EvalChange>> {
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
        out.push(EvalChange {
            base: parent.id(),
            text: String::from_utf8_lossy(c.message_bytes()).into_owned(),
            touched: files.clone(),
            files,
            renames: Vec::new(),
        });
    }
    Ok(out)
}

/// A change to evaluate on: its base, text, the changed files that exist at the base (the
/// ones that can be hidden, by their names there), and for the history of later changes
/// every path it touched and its renames.
#[derive(Debug, Clone)]
pub struct EvalChange {
    pub base: Oid,
    pub text: String,
    pub files: Vec<String>,
    pub touched: Vec<String>,
    pub renames: Vec<(String, String)>,
}

impl EvalChange {
    fn earlier(&self) -> Earlier {
        Earlier::new(self.touched.clone(), &self.text).with_renames(self.renames.clone())
    }
}

/// Leave-one-out cases of `changes` (oldest first), the histories they see, and the
/// candidates at each change's base (read once per change).
struct CaseSet {
    cases: Vec<EvalCase>,
    histories: Vec<Earlier>,
}

fn case_set(repo: &Repository, changes: &[EvalChange], from: usize) -> Result<CaseSet> {
    let mut cases = Vec::new();
    for (k, c) in changes.iter().enumerate().skip(from) {
        eval_cases_for_change(repo, k, c.base, &c.text, &c.files, k, &mut cases)?;
    }
    Ok(CaseSet { cases, histories: changes.iter().map(EvalChange::earlier).collect() })
}

/// Runs `f` on every case with its candidates (the case's visible files excluded) and its
/// position among them, one change at a time; `end_change` after each change's cases.
fn for_each_case(
    repo: &Repository,
    set: &CaseSet,
    cfg: &RelevanceConfig,
    mut f: impl FnMut(&EvalCase, &Change, &mut Vec<Candidate>, usize) -> Result<()>,
    mut end_change: impl FnMut(),
) -> Result<usize> {
    let mut total_candidates = 0usize;
    let mut i = 0;
    while i < set.cases.len() {
        let change_idx = set.cases[i].change;
        let all = candidates(repo, set.cases[i].base, &HashSet::new(), cfg.max_candidate_bytes)?;
        while i < set.cases.len() && set.cases[i].change == change_idx {
            let case = &set.cases[i];
            let exclude: HashSet<&String> = case.visible.iter().collect();
            let mut cands: Vec<Candidate> = all.iter().filter(|c| !exclude.contains(&c.path)).cloned().collect();
            total_candidates += cands.len();
            if let Some(target) = cands.iter().position(|c| c.path == case.hidden) {
                let change = Change {
                    text: case.text.clone(),
                    changed: case.visible.clone(),
                    changed_content: case.changed_content.clone(),
                    history: &set.histories[..case.history_len],
                };
                f(case, &change, &mut cands, target)?;
            }
            i += 1;
        }
        end_change();
    }
    Ok(total_candidates)
}

/// Weights learned on the most recent `train_cases` leave-one-out cases of a repository's
/// `changes` (oldest first), with the number of cases; `base` when there are too few.
pub fn fit_on_history(
    repo: &Repository,
    changes: &[EvalChange],
    base: Pipeline,
    cfg: &RelevanceConfig,
    facts: &mut FactsCache,
    mut embedder: Option<&mut Embedder>,
) -> Result<(Pipeline, usize)> {
    // Changes have one to a few code files to hide each: start far enough back for the cases.
    let from = changes.len().saturating_sub(cfg.train_cases);
    let set = case_set(repo, changes, from)?;
    let skip = set.cases.len().saturating_sub(cfg.train_cases);
    let learner = std::cell::RefCell::new(Learner::new(base.clone(), cfg));
    let mut seen = 0usize;
    for_each_case(
        repo,
        &set,
        cfg,
        |_, change, cands, target| {
            seen += 1;
            if seen > skip {
                let ranked = rank_change(change, cands, &base, true, facts, embedder.as_deref_mut())?;
                learner.borrow_mut().observe(&ranked, target);
            }
            Ok(())
        },
        || learner.borrow_mut().end_pr_without_fit(),
    )?;
    let mut learner = learner.into_inner();
    let n = learner.cases();
    if n < cfg.min_train_cases {
        return Ok((base, n));
    }
    learner.refit();
    Ok((learner.pipeline, n))
}

/// Evaluates on changes `(base commit, text, changed paths)` of one repository, in time
/// order. The learned rankers are fitted, as PRs go by, on earlier PRs only. `features_out`
/// gets every case's features (JSON lines) for fitting rankers elsewhere.
pub fn evaluate(
    repo: &Repository,
    changes: &[EvalChange],
    cfg: &RelevanceConfig,
    encoder: Option<&Encoder>,
    mut features_out: Option<&mut dyn std::io::Write>,
) -> Result<EvalReport> {
    let set = case_set(repo, changes, 0)?;
    let mut report = EvalReport { cases: set.cases.len(), ..Default::default() };
    if set.cases.is_empty() {
        return Ok(report);
    }
    struct Variant {
        name: String,
        use_paths: bool,
        pipeline: Pipeline,
        learner: Option<Learner>,
        hits: [usize; 3],
    }
    let suffix = if encoder.is_some() { "" } else { ", no encoder" };
    let mut variants: Vec<Variant> = Vec::new();
    let bm25 = Pipeline { ranker: Ranker::Bm25, ..Pipeline::from_config(cfg) };
    let hybrid = Pipeline { ranker: Ranker::Hybrid, ..Pipeline::from_config(cfg) };
    for (use_paths, label) in [(true, "text + paths"), (false, "text only")] {
        let variant = |name: String, pipeline: &Pipeline, learner: Option<Learner>| Variant {
            name,
            use_paths,
            pipeline: pipeline.clone(),
            learner,
            hits: [0; 3],
        };
        variants.push(variant(format!("bm25 ({label})"), &bm25, None));
        variants.push(variant(format!("hybrid, config weights{suffix} ({label})"), &hybrid, None));
        variants.push(variant(format!("learned{suffix} ({label})"), &hybrid, Some(Learner::new(hybrid.clone(), cfg))));
    }
    let mut cache = EmbeddingCache { batch_by_length: true, ..Default::default() };
    let mut facts = FactsCache::default();
    let variants_cell = std::cell::RefCell::new(&mut variants);
    let total_candidates = for_each_case(
        repo,
        &set,
        cfg,
        |case, change, cands, target| {
            for v in variants_cell.borrow_mut().iter_mut() {
                let pipeline = v.learner.as_ref().map_or(&v.pipeline, |l| &l.pipeline);
                let mut em = encoder.map(|e| Embedder { encoder: e, cache: &mut cache, config: cfg });
                let ranked = rank_change(change, cands, pipeline, v.use_paths, &mut facts, em.as_mut())?;
                let pos = ranked.order.iter().position(|(i, _)| *i == target).unwrap_or(usize::MAX);
                for (k, slot) in [1usize, 5, 10].iter().zip(v.hits.iter_mut()) {
                    if pos < *k {
                        *slot += 1;
                    }
                }
                if let Some(out) = features_out.as_deref_mut() {
                    if v.learner.is_some() {
                        let line = serde_json::json!({
                            "variant": v.name, "change": case.change, "target": target,
                            "hidden": case.hidden, "visible": case.visible,
                            "top": ranked.order.iter().take(10).map(|(i, _)| &cands[*i].path).collect::<Vec<_>>(),
                            "reranked": ranked.reranked, "x": ranked.x,
                        });
                        writeln!(out, "{line}")?;
                    }
                }
                if let Some(l) = v.learner.as_mut() {
                    l.observe(&ranked, target);
                }
            }
            Ok(())
        },
        || {
            for v in variants_cell.borrow_mut().iter_mut() {
                if let Some(l) = v.learner.as_mut() {
                    l.end_pr();
                }
            }
        },
    )?;
    let n = set.cases.len() as f64;
    for v in variants {
        report.recall.insert(v.name.clone(), [v.hits[0] as f64 / n, v.hits[1] as f64 / n, v.hits[2] as f64 / n]);
        if let Some(l) = v.learner {
            let named = |m: &Model| FEATURES.iter().zip(m.weights).map(|(k, w)| (k.to_string(), w)).collect();
            report.learned.insert(
                v.name,
                LearnedSummary {
                    fits: l.fits,
                    first_stage: named(&l.pipeline.cheap),
                    second_stage: if encoder.is_some() { named(&l.pipeline.full) } else { BTreeMap::new() },
                },
            );
        }
    }
    report.encoder_files_per_second =
        if cache.embed_seconds > 0.0 { cache.embedded_texts as f64 / cache.embed_seconds } else { 0.0 };
    report.embedding_cache_hit_rate = cache.hit_rate();
    report.embedded_chunks = cache.embedded_texts;
    report.candidates_per_case = total_candidates as f64 / n;
    Ok(report)
}

/// Changes of one repository from a lake: merged, snapshotted PRs in time order.
pub async fn changes_from_lake(lake: &Lake, repo_name: &str) -> Result<Vec<EvalChange>> {
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
    let mut out: Vec<EvalChange> = Vec::new();
    for r in crate::query::rows::<Row>(&ctx, EVAL_CHANGES_SQL).await.context("sql/relevance_eval_changes.sql")? {
        let oid = Oid::from_str(&r.merge_base).with_context(|| format!("merge base {:?}", r.merge_base))?;
        if !matches!(out.last(), Some(last) if last.base == oid && last.text == r.text) {
            out.push(EvalChange {
                base: oid,
                text: r.text.clone(),
                files: Vec::new(),
                touched: Vec::new(),
                renames: Vec::new(),
            });
        }
        let last = out.last_mut().expect("pushed above");
        last.touched.push(r.path.clone());
        if let Some(o) = &r.old_path {
            last.touched.push(o.clone());
            if r.status.starts_with('R') {
                last.renames.push((o.clone(), r.path.clone()));
            }
        }
        // The file as it is at the base: the old path of renames; additions do not exist there.
        if r.status != "A" {
            last.files.push(r.old_path.unwrap_or(r.path));
        }
    }
    // A change that only added files has nothing to hide but is still history.
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ranks_count_each_case_and_the_reciprocal_ranks() {
        let ((better, worse, same), before, now) = paired_ranks(&[0, 4, 9, usize::MAX], &[1, 2, 9, 0]).unwrap();
        assert_eq!((better, worse, same), (2, 1, 1));
        assert!((before - (1.0 + 0.2 + 0.1 + 0.0) / 4.0).abs() < 1e-12);
        assert!((now - (0.5 + 1.0 / 3.0 + 0.1 + 1.0) / 4.0).abs() < 1e-12);
        assert!(paired_ranks(&[0], &[0, 1]).is_none());
        assert_eq!(recall_of(&[0, 4, 9, 10, usize::MAX]), [0.2, 0.4, 0.6]);
    }

    #[test]
    fn cached_vectors_are_keyed_by_chunk_size() {
        let at = |chunk_chars| embedding_space(&RelevanceConfig { chunk_chars, ..Default::default() });
        // Lakes made at the first chunk size keep their cache; another size is another space.
        assert_eq!(at(BEFORE_CHUNK_CHARS), encoder::MODEL_NAME);
        assert_ne!(at(800), at(BEFORE_CHUNK_CHARS));
        assert_ne!(at(800), at(900));
        // Chunk 1 of a file is other text at another size: a vector cached at one is wrong at the other.
        let text: String = (0..200).map(|i| format!("line {i} of the file\n")).collect();
        assert_ne!(chunks("f.py", &text, 800, 16)[1], chunks("f.py", &text, BEFORE_CHUNK_CHARS, 8)[1]);
    }
}
