//! What every swelake crate shares and none of them owns: model and runtime files fetched from
//! PyPI wheels into a cache ([`models`]), allocator settings for long runs ([`memory`]), progress
//! bars ([`progress`]), PNG charts ([`charts`]), the one stable hash ([`hash`]) and the one
//! seeded generator ([`rng`]).
//!
//! Not here: anything about lakes, tables or git (the `swelake` crate's infrastructure layer),
//! the reward or the trainer. This crate imports no other swelake crate.

pub mod charts;
pub mod hash;
pub mod memory;
pub mod models;
pub mod progress;
pub mod rng;
