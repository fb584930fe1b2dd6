//! The curation config (`config/curation.toml`): thresholds of the quality filters, the
//! relevant-file ranker and the seed dataset, with documented defaults.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

pub const DEFAULT: &str = include_str!("../config/curation.toml");

#[derive(Debug, Clone, Deserialize)]
pub struct CurationConfig {
    pub filters: FilterConfig,
    pub relevance: RelevanceConfig,
    pub seed: SeedConfig,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FilterConfig {
    pub min_files: i64,
    pub max_files: i64,
    pub max_changed_lines: i64,
    pub min_issue_chars: i64,
    pub require_linked_issue: bool,
    pub bot_accounts: Vec<String>,
    pub bot_login_patterns: Vec<String>,
    pub bot_words: Vec<String>,
    pub noise_paths: Vec<String>,
    pub decontaminate: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RelevanceConfig {
    pub top_k: usize,
    pub ranker: crate::relevance::rank::Ranker,
    pub max_candidate_bytes: usize,
    pub chunk_chars: usize,
    pub max_chunks: usize,
    pub weights: crate::relevance::rank::Weights,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeedConfig {
    pub max_prompt_tokens: usize,
    pub tokenizer: String,
    pub test_fraction: f64,
    pub test_after: String,
    pub rows_per_shard: usize,
    pub system_template: String,
    pub user_template: String,
    pub shuffle_seed: u64,
}

impl CurationConfig {
    /// The built-in config, or `path` (a complete config file) when given.
    pub fn load(path: Option<&Path>) -> Result<CurationConfig> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
            }
            None => Ok(toml::from_str(DEFAULT).expect("the built-in config/curation.toml parses")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_config_parses_and_patterns_compile() {
        let c = super::CurationConfig::load(None).unwrap();
        assert_eq!(c.filters.max_files, 15);
        for p in c.filters.bot_login_patterns.iter().chain(&c.filters.noise_paths) {
            regex::Regex::new(p).unwrap();
        }
    }
}
