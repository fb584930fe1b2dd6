//! Leave-one-out evaluation: cases from a lake's merged PRs or any repository's history, each
//! ranker on the same cases, recall@1/5/10 (`swelake eval-relevance`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use super::cache::EmbeddingCache;
use super::encoder::Encoder;
use super::job::RepoContext;
use super::pipeline::{candidates, contents_at, rank_change, Change, Embedder, Learner, Ranked};
use super::rank::{Candidate, Earlier, FactsCache, Model, Ranker, FEATURES};
use super::Pipeline;
use super::{RelevanceConfig, EVAL_CHANGES_SQL};
use crate::git;
use crate::lake::Lake;

/// Leave-one-out recall@1/5/10 on the PRs of `ctx`: each changed code file that exists at
/// the base hidden in turn, the PR's other files visible. Returns the hidden file's rank in
/// each case (`usize::MAX` when it is not ranked) and the recall.
pub(crate) fn loo_recall(
    ctx: &RepoContext,
    pipeline: &Pipeline,
    cfg: &RelevanceConfig,
    enc: Option<&Encoder>,
    cache: &mut EmbeddingCache,
    facts: &FactsCache,
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

/// One leave-one-out case: a change with one of its files hidden among the candidates.
pub(crate) struct EvalCase {
    /// Index of its change (cases of one change share text and base).
    pub(crate) change: usize,
    pub(crate) text: String,
    pub(crate) visible: Vec<String>,
    pub(crate) hidden: String,
    pub(crate) base: Oid,
    /// How many earlier changes its history holds.
    pub(crate) history_len: usize,
    pub(crate) changed_content: HashMap<String, Arc<str>>,
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

pub(crate) fn eval_cases_for_change(
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
pub(crate) struct CaseSet {
    pub(crate) cases: Vec<EvalCase>,
    pub(crate) histories: Vec<Earlier>,
}

pub(crate) fn case_set(repo: &Repository, changes: &[EvalChange], from: usize) -> Result<CaseSet> {
    let mut cases = Vec::new();
    for (k, c) in changes.iter().enumerate().skip(from) {
        eval_cases_for_change(repo, k, c.base, &c.text, &c.files, k, &mut cases)?;
    }
    Ok(CaseSet { cases, histories: changes.iter().map(EvalChange::earlier).collect() })
}

impl CaseSet {
    /// The change a case ranks: its text, its visible files and the history before it.
    pub(crate) fn change(&self, case: &EvalCase) -> Change<'_> {
        Change {
            text: case.text.clone(),
            changed: case.visible.clone(),
            changed_content: case.changed_content.clone(),
            history: &self.histories[..case.history_len],
        }
    }
}

/// A case's candidates (those at its base but its visible files) and the hidden file's place.
fn case_candidates(all: &[Candidate], case: &EvalCase) -> (Vec<Candidate>, Option<usize>) {
    let exclude: HashSet<&String> = case.visible.iter().collect();
    let cands: Vec<Candidate> = all.iter().filter(|c| !exclude.contains(&c.path)).cloned().collect();
    let target = cands.iter().position(|c| c.path == case.hidden);
    (cands, target)
}

/// Runs `f` on every case with its candidates (the case's visible files excluded) and its
/// position among them, one change at a time; `end_change` after each change's cases.
pub(crate) fn for_each_case(
    repo: &Repository,
    set: &CaseSet,
    cfg: &RelevanceConfig,
    mut f: impl FnMut(&EvalCase, &Change, &mut Vec<Candidate>, usize) -> Result<()>,
    mut end_change: impl FnMut(),
) -> Result<usize> {
    let mut total_candidates = 0usize;
    for group in set.cases.chunk_by(|a, b| a.change == b.change) {
        let all = candidates(repo, group[0].base, &HashSet::new(), cfg.max_candidate_bytes)?;
        for case in group {
            let (mut cands, target) = case_candidates(&all, case);
            total_candidates += cands.len();
            if let Some(target) = target {
                f(case, &set.change(case), &mut cands, target)?;
            }
        }
        end_change();
    }
    Ok(total_candidates)
}

/// Weights learned on the most recent `train_cases` leave-one-out cases of a repository's
/// `changes` (oldest first), with the number of cases; `base` when there are too few.
/// Without an embedder the cases are ranked on all cores (a case's cheap features do not
/// depend on another's) and learned from in their order, so the fit is the same on any
/// number of threads.
pub fn fit_on_history(
    repo: &Repository,
    changes: &[EvalChange],
    base: Pipeline,
    cfg: &RelevanceConfig,
    facts: &FactsCache,
    embedder: Option<&mut Embedder>,
) -> Result<(Pipeline, usize)> {
    use rayon::prelude::*;
    // Changes have one to a few code files to hide each: start far enough back for the cases.
    let from = changes.len().saturating_sub(cfg.train_cases);
    let set = case_set(repo, changes, from)?;
    let skip = set.cases.len().saturating_sub(cfg.train_cases);
    let mut learner = Learner::new(base.clone(), cfg);
    // The cases with their candidates, read from git in order (one tree per change).
    let mut work: Vec<(&EvalCase, Vec<Candidate>, usize)> = Vec::new();
    let mut seen = 0usize;
    for group in set.cases.chunk_by(|a, b| a.change == b.change) {
        let all = candidates(repo, group[0].base, &HashSet::new(), cfg.max_candidate_bytes)?;
        for case in group {
            let (cands, target) = case_candidates(&all, case);
            let Some(target) = target else { continue };
            seen += 1;
            if seen > skip {
                work.push((case, cands, target));
            }
        }
    }
    if let Some(em) = embedder {
        for (case, cands, target) in &mut work {
            let ranked = rank_change(&set.change(case), cands, &base, true, facts, Some(&mut *em))?;
            learner.observe(&ranked, *target);
        }
    } else {
        let ranked: Vec<Result<Ranked>> = work
            .par_iter_mut()
            .map(|(case, cands, _)| rank_change(&set.change(case), cands, &base, true, facts, None))
            .collect();
        for ((_, _, target), r) in work.iter().zip(ranked) {
            learner.observe(&r?, *target);
        }
    }
    learner.end_pr_without_fit();
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
    let facts = FactsCache::default();
    let variants_cell = std::cell::RefCell::new(&mut variants);
    let total_candidates = for_each_case(
        repo,
        &set,
        cfg,
        |case, change, cands, target| {
            for v in variants_cell.borrow_mut().iter_mut() {
                let pipeline = v.learner.as_ref().map_or(&v.pipeline, |l| &l.pipeline);
                let mut em = encoder.map(|e| Embedder { encoder: e, cache: &mut cache, config: cfg });
                let ranked = rank_change(change, cands, pipeline, v.use_paths, &facts, em.as_mut())?;
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
