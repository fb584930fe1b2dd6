//! What `swelake ingest --github` read from GitHub's REST API, per repository
//! (`github_api_repos`, written by that stage), for the layers that show it: `swelake status`,
//! the console's sources page and the dataset card.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::lake::Lake;

/// The table of what the API gave per repository.
pub const GITHUB_API_REPOS: &str = "github_api_repos";

/// One repository's row, without its ETags (they are the reader's, not the operator's).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ApiSource {
    pub repo_name: String,
    /// ok | not_found | stopped | failed.
    pub status: String,
    pub reason: String,
    /// The name GitHub serves the repository under now (a rename shows here).
    pub current_name: String,
    /// The newest `updated_at` read: the next run asks for what changed since.
    pub watermark: String,
    pub calls_last_run: i64,
    /// Of those, the ones answered 304 Not Modified (no quota spent).
    pub not_modified_last_run: i64,
    pub calls_total: i64,
    pub prs_last_run: i64,
    pub issues_last_run: i64,
    pub comments_last_run: i64,
    pub prs_total: i64,
    pub issues_total: i64,
    pub comments_total: i64,
    /// `x-ratelimit-remaining` after the repository's last call.
    pub quota_remaining: Option<i64>,
    pub last_run_at: String,
    /// Reviews read (`--reviews`); NULL in rows written before they were counted.
    #[serde(default)]
    pub reviews_last_run: Option<i64>,
    #[serde(default)]
    pub reviews_total: Option<i64>,
}

/// Every repository `ingest --github` has read into this lake, by name (empty when it never ran).
pub async fn api_sources(lake: &Lake) -> Result<Vec<ApiSource>> {
    if !lake.has_table(GITHUB_API_REPOS).await? {
        return Ok(Vec::new());
    }
    let ctx = lake.session().await?;
    // Every column, by name: a table written before a column existed reads it as absent.
    crate::query::rows(&ctx, &format!("SELECT * FROM {GITHUB_API_REPOS} ORDER BY repo_name")).await
}
