//! Quality filters: the predicates `pr_quality.sql` uses, as DataFusion UDFs configured by the
//! `[filters]` section of the curation config.
//!
//! - `is_bot_account(login, account_type)`: GitHub says Bot, the login ends in `[bot]`, is a
//!   known service account, or matches a service-account pattern (`-bot`, `-ci`, `jenkins`...).
//!   A login that merely ends in "bot" (Abbott, Talbot) is a person.
//! - `botlike_text(text)`: a title or body with `dependabot`, `renovate`, `bump`,
//!   `automerge`... as a whole word.
//! - `is_noise_path(path)`: lock files, generated and vendored code.
//! - `is_version_only_patch(patch)`: every changed line only changes version numbers.

pub(crate) mod udf;

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use datafusion::prelude::SessionContext;
use regex::Regex;
use serde::{Deserialize, Serialize};

pub const PR_QUALITY: &str = "pr_quality";

/// The `[filters]` section of the curation config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    pub min_files: i64,
    pub max_files: i64,
    pub max_changed_lines: i64,
    pub min_issue_chars: i64,
    pub require_linked_issue: bool,
    /// Whether a PR without a known issue text becomes an instance with its own title and
    /// body as the problem statement: `never`, `with_issue_ref` (it must reference an issue,
    /// whose text the lake lacks: PRs found in git, issues outside the ingested range) or
    /// `always`.
    pub pr_text_problems: PrTextProblems,
    pub bot_accounts: Vec<String>,
    pub bot_login_patterns: Vec<String>,
    pub bot_words: Vec<String>,
    pub noise_paths: Vec<String>,
    pub decontaminate: Vec<String>,
}

/// See [`FilterConfig::pr_text_problems`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrTextProblems {
    Never,
    WithIssueRef,
    Always,
}

impl PrTextProblems {
    fn name(self) -> &'static str {
        match self {
            PrTextProblems::Never => "never",
            PrTextProblems::WithIssueRef => "with_issue_ref",
            PrTextProblems::Always => "always",
        }
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        crate::config::default_section("filters")
    }
}

/// Makes `config` visible to `sql/pr_quality.sql`: the one-row table `config_filters`
/// (thresholds), the table `config_decontaminate(repo)`, and the filter functions built from
/// the config's patterns (replacing the built-in ones).
pub async fn register_sql(ctx: &SessionContext, config: &FilterConfig) -> anyhow::Result<()> {
    let f = config;
    // Views over literals rather than in-memory tables: a plan that reads them can be shipped
    // to a Ballista cluster, which cannot serialize memory tables.
    let q = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let thresholds = format!(
        "SELECT arrow_cast({}, 'Int64') AS min_files, arrow_cast({}, 'Int64') AS max_files, \
         arrow_cast({}, 'Int64') AS max_changed_lines, arrow_cast({}, 'Int64') AS min_issue_chars, \
         {} AS require_linked_issue, {} AS pr_text_problems",
        f.min_files,
        f.max_files,
        f.max_changed_lines,
        f.min_issue_chars,
        f.require_linked_issue,
        q(f.pr_text_problems.name())
    );
    let thresholds = ctx.sql(&thresholds).await?;
    ctx.register_table("config_filters", thresholds.into_view())?;
    let repos = if f.decontaminate.is_empty() {
        "SELECT arrow_cast(NULL, 'Utf8') AS repo WHERE false".to_string()
    } else {
        let rows: Vec<String> = f.decontaminate.iter().map(|r| format!("({})", q(r))).collect();
        format!("SELECT column1 AS repo FROM (VALUES {})", rows.join(", "))
    };
    let repos = ctx.sql(&repos).await?;
    ctx.register_table("config_decontaminate", repos.into_view())?;
    for u in udf::filter_udfs(Arc::new(Predicates::new(f)?)) {
        ctx.register_udf(u);
    }
    Ok(())
}

/// The compiled predicates.
#[derive(Debug)]
pub struct Predicates {
    accounts: HashSet<String>,
    login_patterns: Vec<Regex>,
    words: Regex,
    noise: Vec<Regex>,
    /// The config these were compiled from, as JSON: what a plan shipped to other processes
    /// carries, so their functions are built from the same config.
    config_json: String,
}

impl Predicates {
    pub fn new(c: &FilterConfig) -> anyhow::Result<Predicates> {
        let login_patterns =
            c.bot_login_patterns.iter().map(|p| Regex::new(&format!("(?i){p}"))).collect::<Result<_, _>>()?;
        let words = c.bot_words.iter().map(|w| regex::escape(w)).collect::<Vec<_>>().join("|");
        // Whole words: not preceded or followed by a letter, digit or underscore.
        let words = Regex::new(&format!(r"(?i)(?:^|[^\w])(?:{words})(?:$|[^\w])"))?;
        let noise = c.noise_paths.iter().map(|p| Regex::new(p)).collect::<Result<_, _>>()?;
        Ok(Predicates {
            accounts: c.bot_accounts.iter().map(|a| a.to_lowercase()).collect(),
            login_patterns,
            words,
            noise,
            config_json: serde_json::to_string(c)?,
        })
    }

    /// Predicates of the built-in config.
    pub fn default_set() -> &'static Arc<Predicates> {
        static P: OnceLock<Arc<Predicates>> = OnceLock::new();
        P.get_or_init(|| Arc::new(Predicates::new(&FilterConfig::default()).expect("built-in patterns compile")))
    }

    pub fn is_bot_account(&self, login: Option<&str>, account_type: Option<&str>) -> bool {
        if account_type.is_some_and(|t| t.eq_ignore_ascii_case("bot")) {
            return true;
        }
        let Some(login) = login else { return false };
        let lower = login.to_lowercase();
        self.accounts.contains(lower.trim_end_matches("[bot]")) || self.login_patterns.iter().any(|p| p.is_match(login))
    }

    pub fn botlike_text(&self, text: &str) -> bool {
        self.words.is_match(text)
    }

    pub fn is_noise_path(&self, path: &str) -> bool {
        self.noise.iter().any(|p| p.is_match(path))
    }
}

fn version_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // 1.2, v1.2.3, 1.2.3-rc.1, ^1.2 / ~=1.2 / >=1.2 (the operators stay), and commit-like hashes.
    RE.get_or_init(|| Regex::new(r"v?\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.]+)?|\b[0-9a-f]{7,40}\b").expect("static regex"))
}

/// Every added and removed line of the patch is the same once version numbers are masked,
/// and at least one line changed: a version bump and nothing else.
pub fn is_version_only_patch(patch: &str) -> bool {
    let mut removed = Vec::new();
    let mut added = Vec::new();
    for line in patch.lines() {
        if line.starts_with("---") || line.starts_with("+++") {
            continue;
        }
        let masked = |l: &str| version_pattern().replace_all(l, "<v>").into_owned();
        if let Some(l) = line.strip_prefix('-') {
            removed.push(masked(l));
        } else if let Some(l) = line.strip_prefix('+') {
            added.push(masked(l));
        }
    }
    if removed.is_empty() && added.is_empty() {
        return false;
    }
    let had_version = removed.iter().chain(&added).all(|l| l.contains("<v>"));
    removed.sort();
    added.sort();
    had_version && removed == added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_patterns_compile() {
        let c = FilterConfig::default();
        assert_eq!(c.max_files, 15);
        for p in c.bot_login_patterns.iter().chain(&c.noise_paths) {
            regex::Regex::new(p).unwrap();
        }
    }

    #[test]
    fn bots_and_people() {
        let p = Predicates::default_set();
        for (login, kind) in [
            ("dependabot[bot]", None),
            ("renovate", None),
            ("github-actions", None),
            ("some-ci", None),
            ("release-bot", None),
            ("acme_bot", None),
            ("jenkins-prod", None),
            ("octo", Some("Bot")),
        ] {
            assert!(p.is_bot_account(Some(login), kind), "{login} is a bot");
        }
        for login in ["abbott", "talbot", "cbot", "robotics-fan", "botany", "mira"] {
            assert!(!p.is_bot_account(Some(login), Some("User")), "{login} is a person");
        }
    }

    #[test]
    fn bot_words_are_whole_words() {
        let p = Predicates::default_set();
        assert!(p.botlike_text("Bump lodash from 4.17.20 to 4.17.21"));
        assert!(p.botlike_text("chore(deps): update with Renovate"));
        assert!(p.botlike_text("enable automerge"));
        assert!(!p.botlike_text("Fix bumpy scrolling on the bumper car page"));
        assert!(!p.botlike_text("Fix divide by zero"));
    }

    #[test]
    fn noise_paths() {
        let p = Predicates::default_set();
        for path in
            ["package-lock.json", "web/yarn.lock", "Cargo.lock", "vendor/x/y.go", "static/app.min.js", "api/foo_pb2.py"]
        {
            assert!(p.is_noise_path(path), "{path}");
        }
        for path in ["src/lock.rs", "calc/ops.py", "docs/building.md", "vendors.py"] {
            assert!(!p.is_noise_path(path), "{path}");
        }
    }

    #[test]
    fn version_only_patches() {
        let bump = "--- a/requirements.txt\n+++ b/requirements.txt\n@@ -1 +1 @@\n-pytest==7.4.0\n+pytest==8.0.0\n";
        assert!(is_version_only_patch(bump));
        let cargo =
            "@@ -3,2 +3,2 @@\n-version = \"0.1.0\"\n+version = \"0.2.0\"\n-serde = \"1.0.1\"\n+serde = \"1.0.2\"\n";
        assert!(is_version_only_patch(cargo));
        let real = "@@ -1 +1 @@\n-    return a / b\n+    return None if b == 0 else a / b\n";
        assert!(!is_version_only_patch(real));
        let mixed = "@@ -1,2 +1,2 @@\n-pytest==7.4.0\n+pytest==8.0.0\n-x = 1\n+x = 2\n";
        assert!(!is_version_only_patch(mixed), "a non-version change rides along");
        assert!(!is_version_only_patch(""));
    }
}
