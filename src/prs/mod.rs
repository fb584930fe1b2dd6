//! Pull-request tables: PRs, issues, timelines and the issues a PR resolves. The tables are
//! built by the SQL jobs (`sql/pr_timeline.sql`, `sql/pull_requests.sql`, `sql/issues.sql`,
//! `sql/pr_issue_links.sql`); this module holds what SQL cannot say: finding the issues a
//! text resolves (`links`) and its SQL function (`udf`), and the merged PRs that git itself
//! records (`from_git`, the `prs_from_git` job), for when the archive is silent.

pub mod from_git;
pub(crate) mod latest;
pub(crate) mod links;
pub(crate) mod udf;

pub const PR_TIMELINE: &str = "pr_timeline";
pub const PULL_REQUESTS: &str = "pull_requests";
pub const ISSUES: &str = "issues";
pub const PR_ISSUE_LINKS: &str = "pr_issue_links";
