//! Relevant-but-unchanged files: for each kept PR, the files of its repository at the merge
//! base that it did not change, ranked (see [`rank`]), top k into `pr_relevant_files`. A
//! prompt that shows only the files that must change teaches a model to edit whatever it
//! is shown; relevant files are the distractors that make it choose.
//!
//! Embeddings are cached per blob in `blob_embeddings` (a file shared by many PRs is embedded
//! once) and the contents of the chosen files are added to the lake's blob store
//! (`file_blobs`), so the seed stage reads only the lake. [`evaluate`] measures rankers leave-one-out on a lake or on any git
//! repository's history.
//!
//! The rooms: `cache` (chunking and the embedding cache), `pipeline` (candidates, the two
//! stages, the learner), `job` (the job and its stored fits), `eval` (leave-one-out cases and
//! recall); [`rank`] the first stage's features and model, [`learn`] the fitting, [`encoder`]
//! the ONNX text encoder, [`imports`] import resolution, `bm25` the lexical scores. This file
//! keeps the table names and the config.

pub(crate) mod bm25;
pub mod encoder;
pub mod imports;
pub mod learn;
pub mod rank;

pub mod cache;
pub mod eval;
pub mod job;
pub mod pipeline;

pub use eval::{
    cases_from_repo, changes_from_lake, evaluate, fit_on_history, paired_ranks, recall_of, EvalChange, EvalReport,
    LearnedSummary,
};
pub use job::{run, RelevanceSummary};
pub use pipeline::Pipeline;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::lake::blobs;
use crate::lake::Lake;
use rank::Ranker;

pub const PR_RELEVANT_FILES: &str = "pr_relevant_files";
pub const BLOB_EMBEDDINGS: &str = "blob_embeddings";
pub const RELEVANCE_MODELS: &str = "relevance_models";
/// The relevance stage: a kept PR at a time; it writes the contents of the files it ranks to
/// the blob store too.
pub struct Relevance;

#[async_trait::async_trait(?Send)]
impl crate::stage::Stage for Relevance {
    fn name(&self) -> &'static str {
        "relevance"
    }

    fn description(&self) -> &'static str {
        "pr_relevant_files: for each kept PR, the top-k files it did not change that are most relevant to it \
         (hybrid ranker: BM25 + MiniLM best chunk + imports/tests/co-change of the changed paths)."
    }

    fn inputs(&self) -> &'static [&'static str] {
        &["pr_quality", "pr_snapshots", "pr_files", "pull_requests", "pr_issue_links", "issues"]
    }

    /// Issue texts join in when the lake has them.
    fn optional_inputs(&self) -> &'static [&'static str] {
        &["pr_issue_links", "issues"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[PR_RELEVANT_FILES, BLOB_EMBEDDINGS, blobs::FILE_BLOBS, RELEVANCE_MODELS]
    }

    /// A PR with relevant files is done (`--force` ranks again).
    fn unit(&self) -> crate::stage::Unit {
        crate::stage::Unit::Column("pr")
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["filters"]
    }

    fn config_section(&self) -> Option<&'static str> {
        Some("relevance")
    }

    fn needs(&self) -> &'static [crate::stage::Need] {
        &[crate::stage::Need::Repositories]
    }

    async fn run(&self, lake: &Lake, ctx: &crate::stage::StageCtx<'_>) -> Result<crate::stage::JobSummary> {
        let opts = RelevanceOptions { scope: ctx.scope()?, config: ctx.config::<RelevanceConfig>() };
        Ok(job::run(lake, &opts).await?.into())
    }
}

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
    /// Refit the weights on a repository's earlier PRs where its history is large enough
    /// (else, and for smaller ones, the config's weights, fitted across repositories).
    pub learn: bool,
    /// Leave-one-out cases (the most recent) a fit reads at most.
    pub train_cases: usize,
    /// ... and at most this many per PR the run ranks, so that a fit costs each ranked PR a
    /// bounded share (a count, not a time: the same input gives the same fit on any machine).
    pub fit_cases_per_pr: usize,
    /// Fewer cases than this: the config's weights.
    pub min_train_cases: usize,
    /// Run the encoder on a fit's cases to refit the embedding's weight too (else the fit
    /// reads the cheap features only and keeps the config's embedding weight).
    pub fit_encoder: bool,
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
    /// The repositories (the mirrors are shared with the snapshots; `force`: rank again PRs
    /// that already have relevant files; `threads`: the encoder's).
    pub scope: crate::git::Scope,
    pub config: RelevanceConfig,
}

#[cfg(test)]
mod tests {
    use super::cache::{chunks, embedding_space, FIRST_CHUNK_CHARS};
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
        assert_eq!(at(FIRST_CHUNK_CHARS), encoder::MODEL_NAME);
        assert_ne!(at(800), at(FIRST_CHUNK_CHARS));
        assert_ne!(at(800), at(900));
        // Chunk 1 of a file is other text at another size: a vector cached at one is wrong at the other.
        let text: String = (0..200).map(|i| format!("line {i} of the file\n")).collect();
        assert_ne!(chunks("f.py", &text, 800, 16)[1], chunks("f.py", &text, FIRST_CHUNK_CHARS, 8)[1]);
    }
}
