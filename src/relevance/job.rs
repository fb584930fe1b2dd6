//! The relevance job: the kept PRs to rank per repository, each repository's fit (stored in
//! `relevance_models` and reused), the ranking, and the rows of `pr_relevant_files`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::array::RecordBatch;
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use super::cache::{embedding_space, EmbeddingCache};
use super::encoder::Encoder;
use super::pipeline::{candidates, contents_at, rank_change, Change, Embedder};
use super::rank::{Earlier, FactsCache, Model, Ranker, FEATURES};
use super::{changes_from_lake, fit_on_history, Pipeline};
use super::{
    RelevanceConfig, RelevanceOptions, BLOB_EMBEDDINGS, FILES_SQL, PRS_SQL, PR_RELEVANT_FILES, RELEVANCE_MODELS,
};
use crate::lake::blobs::{self, BlobRow};
use crate::lake::rows::to_batch;
use crate::lake::Lake;

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RelevanceSummary {
    /// Repositories ranked with the weights stored by an earlier run (no choice this run).
    pub fits_reused: usize,
    /// Repositories whose weights were refitted on their own history this run (the others
    /// ranked with the config's; `relevance_models.reason` says why).
    pub fits: usize,
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
pub(crate) struct PrToRank {
    pub(crate) repo_name: String,
    pub(crate) pr_number: i64,
    pub(crate) merge_base: String,
    pub(crate) text: String,
    pub(crate) merged_at: Option<i64>,
}

/// A changed file of a snapshotted PR (a row of `sql/relevance_files.sql`).
#[derive(Debug, Deserialize)]
pub(crate) struct ChangedFile {
    pub(crate) repo_name: String,
    pub(crate) pr_number: i64,
    pub(crate) path: String,
    pub(crate) old_path: Option<String>,
    pub(crate) merged_at: Option<i64>,
    pub(crate) text: Option<String>,
    pub(crate) status: String,
}

/// Per repository: the PRs to rank, their changed files (path, old path) and the history of
/// changes (merge time, PR, paths).
#[derive(Default)]
pub(crate) struct Work {
    pub(crate) prs: Vec<PrToRank>,
    pub(crate) changed: HashMap<i64, Vec<(String, Option<String>)>>,
    pub(crate) history: Vec<(i64, i64, Earlier)>,
}

pub(crate) async fn load_work(lake: &Lake, force: bool) -> Result<(BTreeMap<String, Work>, usize)> {
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
    let (mut work, already) = load_work(lake, opts.scope.force).await?;
    work.retain(|repo, _| opts.scope.includes(repo));
    summary.prs_already_done = already;
    if work.is_empty() {
        return Ok(summary);
    }
    let cfg = opts.config.clone();
    let enc_loaded = if cfg.ranker == Ranker::Hybrid && cfg.encoder {
        match Encoder::load(opts.scope.threads) {
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
    let enc = enc_loaded.as_ref();
    let space = embedding_space(&cfg);
    let mut cache = EmbeddingCache::load(lake, &space).await?;
    let facts = FactsCache::default();
    let fingerprint = fit_fingerprint(&cfg, enc.map(|e| e.name));
    let stored = if cfg.ranker == Ranker::Hybrid { stored_fits(lake).await? } else { HashMap::new() };
    let mut new_fits: Vec<(String, StoredFit)> = Vec::new();
    let mut rows: Vec<RelevantFile> = Vec::new();
    let mut blobs: Vec<BlobRow> = Vec::new();
    let mut redo: Vec<(String, i64)> = Vec::new();
    for (repo_name, w) in work {
        let repo = match opts.scope.mirrors.open(&repo_name) {
            Ok(r) => r,
            Err(f) => {
                *summary.failures.entry(f.reason.to_string()).or_default() += w.prs.len();
                continue;
            }
        };
        let ctx = RepoContext::new(&repo, &repo_name, w);
        let mut pipeline = Pipeline::from_config(&cfg);
        if cfg.ranker == Ranker::Hybrid {
            let t = Instant::now();
            let changes = changes_from_lake(lake, &repo_name).await?;
            // The last choice serves until the history has grown by a quarter: an hourly run
            // with a few new PRs (or a --force re-rank) does not pay for a fit each time.
            // Another config, feature set or encoder chooses again.
            let reusable = stored
                .get(&repo_name)
                .filter(|f| f.fingerprint == fingerprint && changes.len() * 4 < f.history_changes * 5);
            if let Some(f) = reusable {
                pipeline.cheap = f.cheap.clone();
                pipeline.full = f.full.clone();
                summary.fits_reused += 1;
            } else {
                let as_of = ctx.keys.last().map_or(0, |k| k.0);
                let choice = choose_weights(&cfg, ctx.prs(), |budget| {
                    let fit_cfg = RelevanceConfig { train_cases: budget, ..cfg.clone() };
                    // Without the encoder a fit reads the cheap features only (the embedding
                    // keeps its configured weight): most of a fit's cost is embedding the
                    // top candidates of every case.
                    let mut em = enc.filter(|_| cfg.fit_encoder).map(|e| Embedder {
                        encoder: e,
                        cache: &mut cache,
                        config: &cfg,
                    });
                    fit_on_history(&repo, &changes, pipeline.clone(), &fit_cfg, &facts, em.as_mut())
                })?;
                summary.training_cases += choice.cases;
                summary.fit_seconds += t.elapsed().as_secs_f64();
                if choice.fitted {
                    summary.fits += 1;
                }
                pipeline = choice.pipeline.clone();
                new_fits.push((
                    repo_name.clone(),
                    StoredFit {
                        fingerprint: fingerprint.clone(),
                        history_changes: changes.len(),
                        cheap: choice.pipeline.cheap,
                        full: choice.pipeline.full,
                        weights: if choice.fitted { "fitted" } else { "config" }.to_string(),
                        reason: choice.reason,
                        as_of,
                    },
                ));
            }
        }
        let t = Instant::now();
        let ranked = rank_work(&ctx, &pipeline, &cfg, enc, &mut cache, &facts, &mut summary)?;
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
    if opts.scope.force && lake.has_table(PR_RELEVANT_FILES).await? {
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

/// The weights that rank one repository and why, as `relevance_models` keeps them.
pub(crate) struct StoredFit {
    pub(crate) fingerprint: String,
    pub(crate) history_changes: usize,
    pub(crate) cheap: Model,
    pub(crate) full: Model,
    /// `fitted` (on the repository's own history) or `config`.
    pub(crate) weights: String,
    pub(crate) reason: String,
    /// The newest merge of the history they were chosen on (µs): a rerun writes the same row.
    pub(crate) as_of: i64,
}

/// Weights for one repository, fitted or the config's, with the reason.
pub(crate) struct Choice {
    pub(crate) pipeline: Pipeline,
    pub(crate) fitted: bool,
    pub(crate) cases: usize,
    pub(crate) reason: String,
}

/// Chooses a repository's weights: a fit on its own history (`fit`, given the case budget)
/// when `learn` is on and the PRs to rank buy enough cases, else the config's. The budget is
/// `fit_cases_per_pr` per PR to rank, at most `train_cases`: a fit's cost is cases, so each
/// ranked PR pays a bounded share of it whatever the size of the history.
pub(crate) fn choose_weights(
    cfg: &RelevanceConfig,
    prs: usize,
    fit: impl FnOnce(usize) -> Result<(Pipeline, usize)>,
) -> Result<Choice> {
    let config =
        |reason: String, cases: usize| Choice { pipeline: Pipeline::from_config(cfg), fitted: false, cases, reason };
    if !cfg.learn {
        return Ok(config("learn = false: the config's weights".into(), 0));
    }
    let budget = cfg.train_cases.min(cfg.fit_cases_per_pr.saturating_mul(prs));
    if budget < cfg.min_train_cases {
        return Ok(config(
            format!(
                "{prs} PRs to rank buy {budget} fit cases (fit_cases_per_pr {}), fewer than min_train_cases {}: \
                 the config's weights",
                cfg.fit_cases_per_pr, cfg.min_train_cases
            ),
            0,
        ));
    }
    let (pipeline, offered) = fit(budget)?;
    // Cases the fit could use (a case with a single candidate teaches nothing).
    let cases = pipeline.cheap.fitted_on;
    if cases < cfg.min_train_cases || offered < cfg.min_train_cases {
        return Ok(config(
            format!(
                "the history offers {offered} leave-one-out cases ({cases} usable), fewer than min_train_cases {}: \
                 the config's weights",
                cfg.min_train_cases
            ),
            0,
        ));
    }
    let how =
        if cfg.fit_encoder { "every weight" } else { "the first stage's weights (the embedding's from the config)" };
    Ok(Choice {
        pipeline,
        fitted: true,
        cases,
        reason: format!("refitted {how} on the {cases} most recent leave-one-out cases (budget {budget})"),
    })
}

/// What a fit depends on, hashed: the `[relevance]` section (but `top_k`, which only cuts the
/// ranking), the features and the encoder.
pub(crate) fn fit_fingerprint(cfg: &RelevanceConfig, encoder: Option<&str>) -> String {
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
pub(crate) async fn stored_fits(lake: &Lake) -> Result<HashMap<String, StoredFit>> {
    if !lake.has_table(RELEVANCE_MODELS).await? {
        return Ok(HashMap::new());
    }
    type Row = (String, String, i64, i64, i64, Vec<String>, Vec<f64>, Vec<f64>, Option<String>, Option<String>, i64);
    let ctx = lake.session().await?;
    let rows: Vec<Row> = crate::query::rows(
        &ctx,
        &format!(
            "SELECT repo_name, fingerprint, history_changes, training_cases, second_stage_cases, features, \
             first_stage, second_stage, weights, reason, CAST(fitted_at AS BIGINT) FROM {RELEVANCE_MODELS}"
        ),
    )
    .await?;
    let model = |w: &[f64], cases: i64| -> Option<Model> {
        Some(Model { weights: w.try_into().ok()?, fitted_on: cases.max(0) as usize })
    };
    Ok(rows
        .into_iter()
        .filter(|r| r.5.iter().map(String::as_str).eq(FEATURES))
        .filter_map(|(repo, fingerprint, history, cases, full_cases, _, cheap, full, weights, reason, as_of)| {
            let fit = StoredFit {
                fingerprint,
                history_changes: history.max(0) as usize,
                cheap: model(&cheap, cases)?,
                full: model(&full, full_cases)?,
                weights: weights.unwrap_or_else(|| "fitted".into()),
                reason: reason.unwrap_or_default(),
                as_of,
            };
            Some((repo, fit))
        })
        .collect())
}

/// Upserts the new choices into `relevance_models`.
/// A row of `relevance_models`.
#[derive(Serialize)]
struct ModelRow<'a> {
    repo_name: &'a str,
    fingerprint: &'a str,
    history_changes: usize,
    training_cases: usize,
    second_stage_cases: usize,
    features: &'static [&'static str],
    first_stage: &'a [f64],
    second_stage: &'a [f64],
    fitted_at: i64,
    weights: &'a str,
    reason: &'a str,
}

pub(crate) async fn store_fits(lake: &Lake, fits: Vec<(String, StoredFit)>) -> Result<()> {
    if fits.is_empty() {
        return Ok(());
    }
    let rows: Vec<ModelRow> = fits
        .iter()
        .map(|(repo, f)| ModelRow {
            repo_name: repo,
            fingerprint: &f.fingerprint,
            history_changes: f.history_changes,
            training_cases: f.cheap.fitted_on,
            second_stage_cases: f.full.fitted_on,
            features: &FEATURES,
            first_stage: &f.cheap.weights,
            second_stage: &f.full.weights,
            fitted_at: f.as_of,
            weights: &f.weights,
            reason: &f.reason,
        })
        .collect();
    let batch = to_batch(RELEVANCE_MODELS, &rows)?;
    lake.upsert_rows(RELEVANCE_MODELS, &batch.schema(), &[batch], &["repo_name".to_string()], None, "fits").await?;
    Ok(())
}

/// A repository's PRs to rank, with their changed files and the repository's history in
/// time order.
pub struct RepoContext<'r> {
    pub(crate) repo: &'r Repository,
    pub(crate) repo_name: String,
    pub(crate) work: Work,
    pub(crate) keys: Vec<(i64, i64)>,
    pub(crate) earlier: Vec<Earlier>,
}

impl<'r> RepoContext<'r> {
    pub(crate) fn new(repo: &'r Repository, repo_name: &str, mut work: Work) -> RepoContext<'r> {
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
    pub(crate) fn change(&self, pr: &PrToRank) -> Option<(Oid, Change<'_>, HashSet<String>)> {
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
pub(crate) struct Chosen {
    pub(crate) row: RelevantFile,
    pub(crate) blob_sha: String,
    pub(crate) content: Arc<str>,
}

/// Ranks every PR of `ctx`: per PR, its top-k files.
pub(crate) fn rank_work(
    ctx: &RepoContext,
    pipeline: &Pipeline,
    cfg: &RelevanceConfig,
    enc: Option<&Encoder>,
    cache: &mut EmbeddingCache,
    facts: &FactsCache,
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

/// One row of `pr_relevant_files`.
#[derive(Serialize)]
pub(crate) struct RelevantFile {
    pub(crate) repo_name: String,
    pub(crate) pr_number: i64,
    pub(crate) rank: usize,
    pub(crate) path: String,
    pub(crate) blob_sha: String,
    pub(crate) score: f64,
    pub(crate) model: String,
}

pub(crate) fn relevant_files_batch(rows: &[RelevantFile]) -> Result<RecordBatch> {
    to_batch(PR_RELEVANT_FILES, rows)
}

impl From<RelevanceSummary> for crate::stage::JobSummary {
    fn from(s: RelevanceSummary) -> crate::stage::JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_ranked".to_string(), s.prs as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("candidates".to_string(), s.candidates as i64),
            ("chunks_embedded".to_string(), s.embedded_chunks as i64),
            ("embedding_cache_hit_percent".to_string(), (100.0 * s.embedding_cache_hit_rate).round() as i64),
            ("training_cases".to_string(), s.training_cases as i64),
            ("fit_ms".to_string(), (1000.0 * s.fit_seconds).round() as i64),
            ("fits".to_string(), s.fits as i64),
            ("fits_reused".to_string(), s.fits_reused as i64),
            ("rank_ms".to_string(), (1000.0 * s.rank_seconds).round() as i64),
        ]);
        for (k, v) in &s.failures {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        let partitions = if s.prs > 0 { vec![format!("{} PR(s)", s.prs)] } else { Vec::new() };
        crate::stage::JobSummary { partitions, rows_out: s.rows as u64, notes, ..Default::default() }
    }
}
