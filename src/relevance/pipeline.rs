//! The ranking pipeline: candidates of a change, the query, the first stage over every
//! candidate and the encoder's re-ranking of its top, and the learner that fits the weights on
//! leave-one-out cases.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::Result;
use git2::{Oid, Repository};

use super::cache::EmbeddingCache;
use super::encoder::Encoder;
use super::learn::Example;
use super::rank::{Candidate, Earlier, FactsCache, Model, Query, Ranker, EMBEDDING, NF};
use super::RelevanceConfig;
use super::{learn, rank};
use crate::git;

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
    facts: &FactsCache,
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
    pub(crate) base: Pipeline,
    pub(crate) cheap: Vec<Example>,
    pub(crate) full: Vec<Example>,
    pub(crate) pending: Vec<(Example, Option<Example>)>,
    pub(crate) fitted_at: usize,
    pub(crate) min_cases: usize,
    pub(crate) max_cases: usize,
    /// Refit the embedding's weight (else the starting one stays, as in the job's fits
    /// without the encoder).
    pub(crate) fit_embedding: bool,
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
            fit_embedding: cfg.fit_encoder,
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
        self.pipeline.full = if self.fit_embedding && self.full.len() >= self.min_cases {
            learn::fit_embedding(&recent(&self.full, self.max_cases), &full)
        } else {
            full
        };
        self.fitted_at = self.cheap.len();
        self.fits += 1;
    }
}

/// Contents of `paths` at `commit` (those that are text), by path.
pub(crate) fn contents_at(repo: &Repository, commit: Oid, paths: &[String]) -> HashMap<String, Arc<str>> {
    let mut out = HashMap::new();
    let Ok(files) = crate::git::tree_files(repo, commit) else { return out };
    let wanted: HashSet<&String> = paths.iter().collect();
    for (p, oid, _) in files.into_iter().filter(|(p, _, _)| wanted.contains(p)) {
        if let Ok((b, false)) = crate::git::read_blob(repo, oid) {
            out.insert(p, String::from_utf8_lossy(&b).into());
        }
    }
    out
}
