//! Pull-request tables: PRs, issues, timelines and the issues a PR resolves.

pub mod links;
pub mod udf;
