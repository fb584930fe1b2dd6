//! Element-exact ports of CPython's `difflib.SequenceMatcher` and `difflib.unified_diff`,
//! with the Python `str` semantics (`splitlines`, `strip`, Unicode digits) they are used with.
//!
//! A separate crate so that this hot kernel is compiled with full optimisation even in the
//! dev profile that tests and benchmarks share (see the workspace `Cargo.toml`).

pub mod difflib;
pub mod pystr;
