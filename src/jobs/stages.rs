//! Every Rust stage, as `udfs.rs` lists every SQL function: a new stage is its module and one
//! line here. Each declares its own job (inputs, outputs, unit of work, dependencies, config
//! section, needs); the SQL jobs are declared in `jobs/*.toml`.

use crate::stage::Stage;

/// The built-in Rust stages.
pub static STAGES: &[&dyn Stage] = &[
    &crate::ingest::Ingest,
    &crate::prs::from_git::PrsFromGit,
    &crate::snapshots::Snapshots,
    &crate::relevance::Relevance,
    &crate::verify::Verify,
    &crate::seed::Seed,
];

/// The built-in stage named `name`.
pub fn find(name: &str) -> Option<&'static dyn Stage> {
    STAGES.iter().copied().find(|s| s.name() == name)
}

/// The names of the built-in stages.
pub fn names() -> Vec<&'static str> {
    STAGES.iter().map(|s| s.name()).collect()
}
