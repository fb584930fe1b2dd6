//! Integration tests: one binary (each test binary links the whole dependency tree), one
//! module per stage. They use real Delta tables in temp dirs and the real GH Archive excerpts
//! and parity cases of `../shared` (never copied into the repository).

mod common;
mod curation;
mod ingest;
mod prs;
mod remote;
mod reward;
mod snapshots;
mod train;
