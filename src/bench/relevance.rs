//! `bench relevance`: the relevance stage against the encoder on every chunk of every
//! candidate on the same PRs, and the encoder against Python onnxruntime (`bench/ort_baseline.py`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::lake::Lake;
use crate::relevance::cache::{EmbeddingCache, FIRST_CHUNK_CHARS};
use crate::relevance::encoder::Encoder;
use crate::relevance::eval::{case_set, for_each_case, loo_recall};
use crate::relevance::job::{load_work, rank_work, RepoContext};
use crate::relevance::pipeline::{rank_change, Embedder};
use crate::relevance::rank::FactsCache;
use crate::relevance::{changes_from_lake, Pipeline, RelevanceConfig, RelevanceSummary};
use git2::Repository;
use serde::Serialize;

/// The stage's chunking before re-ranking, besides its chunk size: at most 8 chunks per file.
pub(super) const BEFORE_MAX_CHUNKS: usize = 8;

#[derive(Debug, Clone)]
pub struct RelevanceBenchOptions {
    pub lake: String,
    pub repo_name: String,
    pub repo_url: String,
    pub cache_dir: PathBuf,
    /// Kept PRs ranked (spread over the repository's history).
    pub prs: usize,
    /// Encoder threads, both sides (and Python's).
    pub threads: usize,
    pub config: Option<PathBuf>,
    /// Also compare the sides on every leave-one-out case of the lake's merged PRs.
    pub every_case: bool,
    pub work: PathBuf,
}

pub(super) const ORT_BASELINE: &str = include_str!("../../bench/ort_baseline.py");

/// `swelake bench relevance`: the relevance stage before re-ranking against now on the same
/// PRs (PRs/s, chunks/s, embedding cache hit rate, leave-one-out recall of both), and Python
/// onnxruntime encoding the chunks the stage now embeds, when python3 has it.
pub async fn relevance(a: &RelevanceBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work).with_context(|| format!("creating {}", a.work.display()))?;
    let lake = crate::lake::Lake::open(&a.lake)?;
    let cfg = crate::jobs::CurationConfig::load(a.config.as_deref())?.relevance;
    let mirrors = crate::git::Mirrors::new(a.repo_url.clone(), a.cache_dir.clone());
    let repo = mirrors.open(&a.repo_name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
    let enc = crate::relevance::encoder::Encoder::load(a.threads)?;
    // What a user pays: the job itself on a copy of the lake, from cold (no embeddings, no
    // stored fit: the fit is included) and then warm.
    let job = job_sides(&lake, a, &cfg).await?;
    let sides = bench_sides(&lake, &repo, &a.repo_name, a.prs, &cfg, &enc, a.every_case).await?;
    println!(
        "the relevance job on a copy of the lake, {} kept PRs of {} ({} threads):\n",
        job[0].prs, a.repo_name, a.threads
    );
    println!("{:<44} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}", "", "seconds", "s/PR", "fit s", "cases", "rank s", "chunks");
    for j in &job {
        println!(
            "{:<44} {:>8.1} {:>8.2} {:>8.1} {:>8} {:>9.1} {:>8}",
            j.name,
            j.seconds,
            j.seconds / j.prs.max(1) as f64,
            j.fit_seconds,
            j.training_cases,
            j.rank_seconds,
            j.embedded_chunks
        );
    }
    if let Some(before) = sides.first() {
        let base = before.seconds / before.prs.max(1) as f64;
        println!(
            "{:<44} {:>8.1} {:>8.2}   ({} PRs, ranking only, from an empty cache)",
            before.name, before.seconds, base, before.prs
        );
        for j in &job {
            println!(
                "{}: {:.1}x the encoder on every chunk, per PR",
                j.name,
                base / (j.seconds / j.prs.max(1) as f64).max(1e-9)
            );
        }
        println!();
    }
    println!(
        "relevance of {} kept PRs of {} ({} encoder threads), each side from an empty embedding cache\n",
        sides.first().map_or(0, |s| s.prs),
        a.repo_name,
        a.threads
    );
    println!(
        "{:<40} {:>8} {:>8} {:>9} {:>9} {:>8}  {:>22}",
        "", "s/PR", "PRs/s", "chunks", "chunks/s", "hit rate", "LOO recall@1/5/10"
    );
    for s in &sides {
        println!(
            "{:<40} {:>8.2} {:>8.3} {:>9} {:>9.1} {:>7.1}%  {:>6.3} {:>6.3} {:>6.3} ({} cases)",
            s.name,
            s.seconds / s.prs.max(1) as f64,
            s.prs_per_second,
            s.embedded_chunks,
            s.chunks_per_second,
            100.0 * s.embedding_cache_hit_rate,
            s.loo_recall[0],
            s.loo_recall[1],
            s.loo_recall[2],
            s.loo_cases
        );
    }
    if let [before, now] = &sides[..] {
        if let Some(((better, worse, same), mrr_before, mrr_now)) =
            crate::relevance::paired_ranks(&before.loo_ranks, &now.loo_ranks)
        {
            println!(
                "case by case: the hidden file ranks higher now in {better}, lower in {worse}, the same in {same}; mean reciprocal rank {mrr_before:.3} before, {mrr_now:.3} now"
            );
        }
        if a.every_case {
            println!("\nevery leave-one-out case of the lake's merged PRs of {}:", a.repo_name);
            for s in &sides {
                let r = crate::relevance::recall_of(&s.every_case_ranks);
                println!(
                    "{:<40} recall@1/5/10 {:>6.3} {:>6.3} {:>6.3} ({} cases)",
                    s.name,
                    r[0],
                    r[1],
                    r[2],
                    s.every_case_ranks.len()
                );
            }
            if let Some(((better, worse, same), mrr_before, mrr_now)) =
                crate::relevance::paired_ranks(&before.every_case_ranks, &now.every_case_ranks)
            {
                println!(
                    "case by case: higher now in {better}, lower in {worse}, the same in {same}; mean reciprocal rank {mrr_before:.3} before, {mrr_now:.3} now"
                );
            }
        }
        println!("\nspeed-up per PR: {:.1}x", now.prs_per_second / before.prs_per_second.max(1e-12));
        let rust_rate = now.chunks_per_second;
        let has_ort = Command::new("python3")
            .args(["-c", "import onnxruntime, numpy"])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !has_ort {
            println!(
                "{:<40} (python3 cannot import onnxruntime and numpy: pip install onnxruntime numpy)",
                "python onnxruntime"
            );
            return Ok(());
        }
        // The same chunks, tokenised by swelake, so both sides run the same model on the same ids.
        let refs: Vec<&str> = now.chunk_texts.iter().map(|s| s.as_str()).collect();
        let ids = enc.token_ids(&refs)?;
        let ids_file = a.work.join("chunk_ids.json");
        std::fs::write(&ids_file, serde_json::to_vec(&ids)?)?;
        let script = a.work.join("ort_baseline.py");
        std::fs::write(&script, ORT_BASELINE)?;
        let model = crate::models::fetch(&crate::models::MINILM_MODEL)?;
        let out = Command::new("python3")
            .arg(&script)
            .arg(&model)
            .arg(&ids_file)
            .arg(a.threads.to_string())
            .arg("32")
            .output()
            .context("running python3 onnxruntime")?;
        if !out.status.success() {
            bail!("python onnxruntime baseline failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading the baseline's output")?;
        let py_rate = v["chunks"].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(1.0).max(1e-9);
        println!(
            "encoding the {} chunks: swelake {:.1} chunks/s, python onnxruntime {:.1} chunks/s (ratio {:.2})",
            now.chunk_texts.len(),
            rust_rate,
            py_rate,
            rust_rate / py_rate.max(1e-12)
        );
    }
    Ok(())
}

/// One side of `swelake bench relevance`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct BenchSide {
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
pub(super) async fn bench_sides(
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
        chunk_chars: FIRST_CHUNK_CHARS,
        max_chunks: BEFORE_MAX_CHUNKS,
        ..cfg.clone()
    };
    for (name, rerank, by_length, cfg) in [
        ("before: encoder on every candidate", usize::MAX, false, &every_chunk),
        ("now: cheap stage, encoder on the top", cfg.rerank, true, cfg),
    ] {
        let pipeline = Pipeline { rerank, ..Pipeline::from_config(cfg) };
        let mut cache = EmbeddingCache { batch_by_length: by_length, keep_texts: true, ..Default::default() };
        let facts = FactsCache::default();
        let mut summary = RelevanceSummary::default();
        let t = Instant::now();
        rank_work(&ctx, &pipeline, cfg, Some(enc), &mut cache, &facts, &mut summary)?;
        let seconds = t.elapsed().as_secs_f64();
        let (embedded, chunk_s, hit) =
            (cache.embedded_texts, cache.embedded_texts as f64 / cache.embed_seconds.max(1e-9), cache.hit_rate());
        let texts = std::mem::take(&mut cache.texts);
        let (loo_ranks, loo) = loo_recall(&ctx, &pipeline, cfg, Some(enc), &mut cache, &facts)?;
        let mut every_case_ranks = Vec::new();
        if let Some(set) = &every {
            for_each_case(
                repo,
                set,
                cfg,
                |_, change, cands, target| {
                    let mut em = Embedder { encoder: enc, cache: &mut cache, config: cfg };
                    let ranked = rank_change(change, cands, &pipeline, true, &facts, Some(&mut em))?;
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

/// One run of the relevance job in `bench relevance`.
pub(super) struct JobSide {
    pub name: &'static str,
    pub prs: usize,
    pub seconds: f64,
    pub fit_seconds: f64,
    pub training_cases: usize,
    pub rank_seconds: f64,
    pub embedded_chunks: usize,
}

/// Runs the relevance job for `a.repo_name` on a copy of the (local) lake without the stage's
/// tables: cold (the fit and every embedding included), then warm (`--force`: the stored fit
/// and embeddings reused).
async fn job_sides(lake: &Lake, a: &RelevanceBenchOptions, cfg: &RelevanceConfig) -> Result<Vec<JobSide>> {
    let root = lake.local_root().context("bench relevance copies the lake: give a local lake directory")?;
    let copy = a.work.join("lake");
    if copy.exists() {
        std::fs::remove_dir_all(&copy).with_context(|| format!("removing {}", copy.display()))?;
    }
    super::jobs::link_dir(root, &copy)?;
    for t in
        [crate::relevance::PR_RELEVANT_FILES, crate::relevance::BLOB_EMBEDDINGS, crate::relevance::RELEVANCE_MODELS]
    {
        let dir = copy.join(t);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
    }
    let lake = Lake::open(copy.to_str().context("a lake path that is not UTF-8")?)?;
    let mut scope = crate::git::Scope::new(crate::git::Mirrors::new(a.repo_url.clone(), a.cache_dir.clone()));
    scope.repos = Some(vec![a.repo_name.clone()]);
    scope.threads = a.threads;
    let mut out = Vec::new();
    for (name, force) in
        [("cold lake: fit + rank, empty embedding cache", false), ("warm: stored fit and embeddings (--force)", true)]
    {
        let opts = crate::relevance::RelevanceOptions {
            scope: crate::git::Scope { force, ..scope.clone() },
            config: cfg.clone(),
        };
        let t = Instant::now();
        let s = crate::relevance::run(&lake, &opts).await?;
        out.push(JobSide {
            name,
            prs: s.prs,
            seconds: t.elapsed().as_secs_f64(),
            fit_seconds: s.fit_seconds,
            training_cases: s.training_cases,
            rank_seconds: s.rank_seconds,
            embedded_chunks: s.embedded_chunks,
        });
    }
    Ok(out)
}
