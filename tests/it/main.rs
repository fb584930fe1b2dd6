//! Integration tests: one binary (each test binary links the whole dependency tree), one
//! module per stage. They use real Delta tables in temp dirs, the real GH Archive excerpts and
//! parity cases kept in `tests/data`, and (where the checkout has them) the real repository
//! histories of `../shared/history`.

mod common;
mod console;
mod curation;
mod distributed;
mod docs;
mod git_prs;
mod github_api;
mod github_mock;
mod grading;
mod history;
mod ingest;
mod lake;
mod layers;
mod prs;
mod python;
mod remote;
mod reward;
mod rows;
mod snapshots;
mod stages;
mod train;
mod verify;
