//! swelake: batch lakehouse jobs that turn GH Archive events and git history into SWE-RL
//! training data.
//!
//! The stages, in pipeline order, with the tables each reads and writes:
//!
//! | module | reads | writes |
//! |---|---|---|
//! | [`ingest`] | GH Archive hour files | `events`, `events_rejected` |
//! | [`prs`] (SQL jobs `sql/pr_*.sql`, `sql/issues.sql`) | `events` | `pr_timeline`, `pull_requests`, `issues`, `pr_issue_links` |
//! | [`snapshots`] | `pull_requests`, git mirrors | `pr_files`, `file_blobs`, `pr_commits`, `pr_snapshots`, `snapshot_errors` |
//! | [`filters`] (SQL job `sql/pr_quality.sql`) | `pull_requests`, `pr_files`, `pr_issue_links`, `issues`, `pr_snapshots` | `pr_quality` |
//! | [`relevance`] | `pr_quality`, `pr_snapshots`, `pr_files`, `pull_requests`, `pr_issue_links`, `issues`, git mirrors | `pr_relevant_files`, `blob_embeddings`, `file_blobs`, `relevance_models` |
//! | [`verify`] | `pr_quality`, `pull_requests`, `pr_snapshots`, git mirrors | `environments`, `pr_tests`, `pr_verification` |
//! | [`seed`] | `pr_quality`, `pull_requests`, `pr_snapshots`, `pr_files`, `file_blobs`, `pr_relevant_files`, `pr_issue_links`, `issues`, `pr_verification` | `rl_seed`, `seed_rejections`, `shards/seed/*.parquet` |
//! | [`report`] | `pr_quality`, `rl_seed`, `pr_files`, `seed_rejections` | `card.md` and its charts |
//! | [`export`] | `rl_seed`, `pull_requests`, `pr_issue_links`, `events` | a Hugging Face dataset, SWE-bench instances |
//! | [`reward`] (crate `swelake-reward`) | answers, rollout tables | scores |
//! | [`train`] (crate `swelake-train`) | `shards/seed/*.parquet`, rollout tables | checkpoints, `metrics.parquet` |
//!
//! Every job records what it did in `_job_runs` ([`lake::runs`]).
//!
//! The modules form four layers, and a module imports only from layers below its own (a test
//! holds this):
//! 1. infrastructure: [`archive`] (GH Archive's hours and their completeness), [`lake`]
//!    (tables, run records, the blob store), [`schema`] (table
//!    contracts), [`git`], `lang`, [`testfiles`], [`query`] (typed reads), `config` (the curation file), [`files`],
//!    [`stage`] (what a Rust stage is to the scheduler),
//!    and from `swelake-core` [`models`], [`memory`], [`progress`], [`charts`], [`hash`],
//!    [`rng`];
//! 2. stages: [`ingest`], [`prs`], [`snapshots`], [`filters`], [`relevance`], [`verify`], [`seed`],
//!    [`report`], [`reward`], [`train`]; a stage imports infrastructure, and only the reward of
//!    the other stages;
//! 3. orchestration: [`jobs`] (the scheduler), [`distributed`] (the SQL jobs on Ballista), [`udfs`] (every SQL function, registered by the
//!    layers that plan queries), [`sql`] (the `swelake sql` command), [`console`] (`swelake serve`: the web console, the
//!    PostgreSQL wire protocol, and the SQL shell), [`export`], [`synthetic`] (archive days for benchmarks), `demo`, `bench`,
//!    [`samples`];
//! 4. [`cli`]: the command line, the only module that knows clap.

// Infrastructure.
pub mod archive;
pub(crate) mod config;
pub mod files;
pub mod git;
pub mod lake;
pub(crate) mod lang;
pub mod query;
pub mod schema;
pub mod stage;
pub mod testfiles;
pub use swelake_core::{charts, hash, memory, models, progress, rng};

// Stages.
pub mod filters;
pub mod ingest;
pub mod prs;
pub mod relevance;
pub mod report;
pub mod seed;
pub mod snapshots;
pub mod verify;
pub use swelake_reward as reward;
pub use swelake_train as train;

// Orchestration.
pub(crate) mod bench;
pub mod console;
pub(crate) mod demo;
pub mod distributed;
pub mod export;
pub mod jobs;
pub mod samples;
pub mod sql;
pub mod synthetic;
pub mod udfs;

// The command line.
pub mod cli;
