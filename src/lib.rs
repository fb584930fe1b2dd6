//! swelake: batch lakehouse jobs that turn GH Archive events and git history into SWE-RL
//! training data. Each stage is a module with a library entry point; the `swelake` binary
//! (`cli`) is a thin shell over them.

pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod filters;
pub mod ingest;
pub mod jobs;
pub mod lake;
pub mod memory;
pub mod models;
pub mod progress;
pub mod prs;
pub mod relevance;
pub mod report;
pub mod reward;
pub mod samples;
pub mod schema;
pub mod seed;
pub mod snapshots;
pub mod sql;
pub mod train;
pub mod udfs;
