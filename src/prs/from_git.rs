//! Merged pull requests found in git itself, for the stretches where GH Archive is silent
//! (since 2025-05 it misses most of them) and for repositories with no archive at all.
//!
//! For every repository of the lake, the history reachable from its default branch is read:
//! - merge commits `Merge pull request #N from owner/branch` anywhere in it (base = first
//!   parent, head = second parent), not only on the first-parent line: a PR merged into a
//!   release branch that was merged later counts;
//! - squash merges on the first-parent line whose subject ends in `(#N)` (base = parent,
//!   head = the commit);
//! - GitHub's `refs/pull/N/head` whose commit is reachable from the default branch (the PR
//!   was merged with its commits kept), landed by the first first-parent commit that contains
//!   it.
//!
//! Rebase merges rewrite the commits and leave no PR number: they cannot be found.
//! The facts go to `pr_git_facts`, one file per repository; `sql/pull_requests.sql` takes from
//! them what the archive lacks. A repository whose default-branch tip and PR refs did not move
//! since its last scan is not read again.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use anyhow::{Context, Result};
use futures::StreamExt;
use git2::{Oid, Repository, Sort};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::git::GitFailure;
use crate::lake::runs::{self, RunRecord};
use crate::lake::{writer_properties, Codec, Lake, TableWriter};
use crate::stage::{JobSummary, Need, Stage, StageCtx, Unit};

pub const PR_GIT_FACTS: &str = "pr_git_facts";
const JOB: &str = "prs_from_git";

/// The prs_from_git stage: a repository at a time; a repository whose default branch and PR
/// refs did not move since its last scan is not read again.
pub struct PrsFromGit;

#[async_trait::async_trait(?Send)]
impl Stage for PrsFromGit {
    fn name(&self) -> &'static str {
        JOB
    }

    fn description(&self) -> &'static str {
        "Merged PRs as git records them (merge commits, squash merges, refs/pull/N/head) for every repository of \
         the lake, into pr_git_facts; pull_requests fills in what the archive lacks from them. Off for lakes fed \
         by the archive unless --discover-from-git or [discovery] from_git; always on with --repos-file."
    }

    /// The lake's repositories: those of pr_timeline (the PRs' repositories), or --repos-file.
    fn inputs(&self) -> &'static [&'static str] {
        &["pr_timeline"]
    }

    fn optional_inputs(&self) -> &'static [&'static str] {
        &["pr_timeline"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[PR_GIT_FACTS]
    }

    fn unit(&self) -> Unit {
        Unit::Column("repo_name")
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["pr_timeline"]
    }

    fn needs(&self) -> &'static [Need] {
        &[Need::Repositories]
    }

    fn skip(&self, ctx: &StageCtx<'_>) -> Option<String> {
        let on = ctx.git.is_some_and(|g| g.discover_prs) || ctx.named;
        (!on).then(|| {
            "finding PRs in git is off for lakes fed by the archive (--discover-from-git or [discovery] \
             from_git = true; always on with --repos-file)"
                .to_string()
        })
    }

    async fn run(&self, lake: &Lake, ctx: &StageCtx<'_>) -> Result<JobSummary> {
        Ok(run(lake, &GitPrOptions { scope: ctx.scope()? }).await?.into())
    }
}

impl From<GitPrSummary> for JobSummary {
    fn from(s: GitPrSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("repos_unchanged".to_string(), s.repos_unchanged as i64),
            ("commits_read".to_string(), s.commits as i64),
            ("prs_found".to_string(), s.prs as i64),
            ("prs_new_or_changed".to_string(), s.prs_new_or_changed as i64),
            ("numbers_claimed_twice".to_string(), s.ambiguous as i64),
        ]);
        for (k, v) in &s.prs_by_kind {
            notes.insert(format!("kind:{k}"), *v as i64);
        }
        for (k, v) in &s.failures_by_reason {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        if s.commits > 0 {
            notes.insert("ms_per_1000_commits".to_string(), (s.scan_seconds * 1e6 / s.commits as f64).round() as i64);
        }
        JobSummary { partitions: s.repos_scanned, rows_out: s.prs as u64, notes, ..Default::default() }
    }
}

/// How a PR was recognised, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    MergeCommit,
    Squash,
    PullRef,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::MergeCommit => "merge_commit",
            Kind::Squash => "squash",
            Kind::PullRef => "pull_ref",
        }
    }
}

/// One merged PR as git records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitPr {
    pub number: i64,
    pub kind: Kind,
    pub kinds: BTreeSet<Kind>,
    /// Commit time (seconds since the epoch) of the commit that landed it.
    pub merged_at: i64,
    pub base: Oid,
    pub head: Oid,
    pub merge_commit: Oid,
    pub on_first_parent: bool,
    pub head_ref: Option<String>,
    pub head_owner: Option<String>,
    pub title: Option<String>,
    pub body: Option<String>,
    pub author_name: Option<String>,
    pub author_email: Option<String>,
}

/// What one repository's history says.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub default_branch: String,
    /// Commits reachable from the default branch.
    pub commits: usize,
    pub prs: Vec<GitPr>,
    /// Candidates that lost to another of the same number and kind (a number reused by an old
    /// tracker, a fork's own PR merged upstream).
    pub ambiguous: usize,
}

static MERGE_HEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Merge pull request #(\d+) from (\S+)").expect("valid regex"));
static SQUASH_SUFFIX: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(.*?)\s*\(#(\d+)\)$").expect("valid regex"));
static NOREPLY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:\d+\+)?([a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\[bot\])?)@users\.noreply\.github\.com$")
        .expect("valid regex")
});

/// The GitHub login in a no-reply address, if it is one.
pub fn login_of_email(email: &str) -> Option<String> {
    NOREPLY.captures(email.trim()).map(|c| c[1].to_string())
}

fn lossy(b: &[u8]) -> Option<String> {
    text(&String::from_utf8_lossy(b))
}

fn text(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// The first non-empty line of `rest` and what follows it.
fn title_and_body(rest: &str) -> (Option<String>, Option<String>) {
    let rest = rest.trim_start_matches(['\r', '\n', ' ']);
    match rest.split_once('\n') {
        Some((t, b)) => (text(t), text(b)),
        None => (text(rest), None),
    }
}

fn failure(reason: &'static str) -> impl Fn(git2::Error) -> GitFailure {
    move |e| GitFailure { reason, message: e.message().to_string() }
}

/// Reads the merged PRs of `repo`'s default branch.
pub fn scan(repo: &Repository) -> Result<Scan, GitFailure> {
    let corrupt = failure("corrupt_object");
    let Some((branch, tip)) = crate::git::default_branch(repo) else {
        return Err(GitFailure {
            reason: "no_default_branch",
            message: "the mirror has no HEAD branch and none of main, master, develop, trunk".into(),
        });
    };
    let mut out = Scan { default_branch: branch, ..Default::default() };
    // The first-parent line, newest first.
    let mut line = Vec::new();
    let mut at = Some(tip);
    while let Some(o) = at {
        line.push(o);
        let c = repo.find_commit(o).map_err(&corrupt)?;
        at = c.parent_ids().next();
    }
    let on_line: HashSet<Oid> = line.iter().copied().collect();

    let mut candidates: BTreeMap<i64, Vec<GitPr>> = BTreeMap::new();
    let mut reachable: HashSet<Oid> = HashSet::new();
    let mut walk = repo.revwalk().map_err(&corrupt)?;
    walk.set_sorting(Sort::TIME).map_err(&corrupt)?;
    walk.push(tip).map_err(&corrupt)?;
    for oid in walk {
        let oid = oid.map_err(&corrupt)?;
        reachable.insert(oid);
        let c = repo.find_commit(oid).map_err(&corrupt)?;
        let message = String::from_utf8_lossy(c.message_bytes()).into_owned();
        let first_line = message.lines().next().unwrap_or("");
        let time = c.committer().when().seconds();
        if c.parent_count() >= 2 {
            let rest = &message[first_line.len()..];
            let (number, owner, branch, title, body) = if let Some(m) = MERGE_HEADER.captures(first_line) {
                let Ok(number) = m[1].parse::<i64>() else { continue };
                let (owner, branch) = match m[2].split_once('/') {
                    Some((o, b)) => (Some(o.to_string()), Some(b.to_string())),
                    None => (None, Some(m[2].to_string())),
                };
                let (title, body) = title_and_body(rest);
                (number, owner, branch, title, body)
            } else if let Some(m) = SQUASH_SUFFIX.captures(first_line.trim_end()).filter(|_| on_line.contains(&oid)) {
                // A merge whose message is the PR's title with `(#N)` (a custom merge message,
                // as some projects set): a merge commit all the same.
                let Ok(number) = m[2].parse::<i64>() else { continue };
                (number, None, None, text(&m[1]), text(rest))
            } else {
                continue;
            };
            let head = c.parent_id(1).map_err(&corrupt)?;
            let author = repo.find_commit(head).map_err(&corrupt)?.author().to_owned();
            candidates.entry(number).or_default().push(GitPr {
                number,
                kind: Kind::MergeCommit,
                kinds: BTreeSet::from([Kind::MergeCommit]),
                merged_at: time,
                base: c.parent_id(0).map_err(&corrupt)?,
                head,
                merge_commit: oid,
                on_first_parent: on_line.contains(&oid),
                head_ref: branch,
                head_owner: owner,
                title,
                body,
                author_name: lossy(author.name_bytes()),
                author_email: lossy(author.email_bytes()),
            });
        } else if c.parent_count() == 1 && on_line.contains(&oid) {
            let Some(m) = SQUASH_SUFFIX.captures(first_line.trim_end()) else { continue };
            let Ok(number) = m[2].parse::<i64>() else { continue };
            let body = text(&message[first_line.len()..]);
            let author = c.author();
            candidates.entry(number).or_default().push(GitPr {
                number,
                kind: Kind::Squash,
                kinds: BTreeSet::from([Kind::Squash]),
                merged_at: time,
                base: c.parent_id(0).map_err(&corrupt)?,
                head: oid,
                merge_commit: oid,
                on_first_parent: true,
                head_ref: None,
                head_owner: None,
                title: text(&m[1]),
                body,
                author_name: lossy(author.name_bytes()),
                author_email: lossy(author.email_bytes()),
            });
        }
    }
    out.commits = reachable.len();

    // PR refs: only those whose number no commit message names need the landing commit.
    let refs = pull_refs(repo)?;
    let mut landing: Option<HashMap<Oid, Oid>> = None;
    for (number, head, merge_ref) in refs {
        if !reachable.contains(&head) {
            continue;
        }
        if let Some(c) = candidates.get_mut(&number) {
            for x in c.iter_mut() {
                x.kinds.insert(Kind::PullRef);
            }
            continue;
        }
        if landing.is_none() {
            landing = Some(landing_commits(repo, &line)?);
        }
        let Some(&f) = landing.as_ref().and_then(|l| l.get(&head)) else { continue };
        let fc = repo.find_commit(f).map_err(&corrupt)?;
        let base = match merge_ref.and_then(|m| repo.find_commit(m).ok()).and_then(|m| m.parent_id(0).ok()) {
            Some(b) => b,
            None if f != head => fc.parent_id(0).map_err(&corrupt)?,
            None => match repo.find_commit(head).map_err(&corrupt)?.parent_id(0) {
                Ok(p) => p,
                Err(_) => continue,
            },
        };
        let hc = repo.find_commit(head).map_err(&corrupt)?;
        let single = repo
            .merge_base(base, head)
            .ok()
            .is_some_and(|mb| hc.parent_count() == 1 && hc.parent_id(0).ok() == Some(mb));
        let title =
            single.then(|| text(String::from_utf8_lossy(hc.message_bytes()).lines().next().unwrap_or(""))).flatten();
        let author = hc.author();
        candidates.entry(number).or_default().push(GitPr {
            number,
            kind: Kind::PullRef,
            kinds: BTreeSet::from([Kind::PullRef]),
            merged_at: fc.committer().when().seconds(),
            base,
            head,
            merge_commit: f,
            on_first_parent: true,
            head_ref: None,
            head_owner: None,
            title,
            body: None,
            author_name: lossy(author.name_bytes()),
            author_email: lossy(author.email_bytes()),
        });
    }

    for (_, mut c) in candidates {
        let kinds: BTreeSet<Kind> = c.iter().flat_map(|x| x.kinds.iter().copied()).collect();
        // The best kind; among merges of one number, the one on the first-parent line, then
        // the oldest.
        c.sort_by_key(|x| (x.kind, !x.on_first_parent, x.merged_at));
        let same_kind = c.iter().filter(|x| x.kind == c[0].kind).count();
        out.ambiguous += same_kind - 1;
        let mut best = c.swap_remove(0);
        best.kinds = kinds;
        out.prs.push(best);
    }
    Ok(out)
}

/// `(number, head commit, refs/pull/N/merge commit)` of every `refs/pull/N/head`.
fn pull_refs(repo: &Repository) -> Result<Vec<(i64, Oid, Option<Oid>)>, GitFailure> {
    let err = failure("corrupt_object");
    let mut out = Vec::new();
    for r in repo.references_glob("refs/pull/*/head").map_err(&err)? {
        let r = r.map_err(&err)?;
        let Ok(name) = r.name() else { continue };
        let Some(Ok(number)) = name.split('/').nth(2).map(str::parse::<i64>) else { continue };
        let Ok(head) = r.peel_to_commit().map(|c| c.id()) else { continue };
        let merge = repo
            .find_reference(&format!("refs/pull/{number}/merge"))
            .ok()
            .and_then(|m| m.peel_to_commit().ok())
            .map(|c| c.id());
        out.push((number, head, merge));
    }
    Ok(out)
}

/// For every commit reachable from the tip: the first-parent commit that brought it in.
fn landing_commits(repo: &Repository, line: &[Oid]) -> Result<HashMap<Oid, Oid>, GitFailure> {
    let err = failure("corrupt_object");
    let mut out = HashMap::new();
    for (i, &f) in line.iter().enumerate() {
        let mut walk = repo.revwalk().map_err(&err)?;
        walk.push(f).map_err(&err)?;
        if let Some(&p) = line.get(i + 1) {
            walk.hide(p).map_err(&err)?;
        }
        for o in walk {
            out.insert(o.map_err(&err)?, f);
        }
    }
    Ok(out)
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct GitPrOptions {
    /// The repositories (`repos`: the lake's, from `--repos-file`; `None`: those of
    /// `pr_timeline`; `force`: scan again repositories whose refs did not move).
    pub scope: crate::git::Scope,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GitPrSummary {
    pub repos: usize,
    /// Repositories scanned in this run.
    pub repos_scanned: Vec<String>,
    pub repos_unchanged: usize,
    pub failures_by_reason: BTreeMap<String, usize>,
    pub commits: usize,
    pub prs: usize,
    pub prs_by_kind: BTreeMap<String, usize>,
    /// PRs new or changed since their last scan (what pull_requests recomputes).
    pub prs_new_or_changed: usize,
    pub ambiguous: usize,
    pub scan_seconds: f64,
}

enum Outcome {
    Unchanged,
    Scanned { scan: Scan, fingerprint: String, seconds: f64 },
    Failed(GitFailure),
}

/// A fingerprint of what the scan reads: the default branch's tip and every PR ref.
fn refs_fingerprint(repo: &Repository) -> Option<String> {
    let (branch, tip) = crate::git::default_branch(repo)?;
    let mut h = crate::hash::fnv1a(branch.bytes().chain(tip.as_bytes().iter().copied()), crate::hash::OFFSET);
    let mut refs: Vec<(String, Oid)> = repo
        .references_glob("refs/pull/*")
        .ok()?
        .filter_map(|r| r.ok())
        .filter_map(|r| Some((r.name().ok()?.to_string(), r.target()?)))
        .collect();
    refs.sort();
    for (n, o) in refs {
        h = crate::hash::fnv1a(n.bytes().chain(o.as_bytes().iter().copied()), h);
    }
    Some(format!("{h:016x}"))
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The file key of a repository's facts (names are not file-safe; the hash keeps `a.b` and
/// `a_b` apart).
fn file_key(repo: &str) -> String {
    let safe: String = repo.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("{safe}_{:08x}", crate::hash::fnv1a(repo.bytes(), crate::hash::OFFSET) as u32)
}

/// The facts already in the lake for `repo`: number → (what they said, when first written).
#[derive(Deserialize)]
struct Existing {
    number: i64,
    base_sha: String,
    head_sha: String,
    merge_commit_sha: String,
    title: Option<String>,
    body: Option<String>,
    found_at: i64,
}

/// Finds the merged PRs of every repository in scope whose refs moved since its last scan.
pub async fn run(lake: &Lake, opts: &GitPrOptions) -> Result<GitPrSummary> {
    let mut summary = GitPrSummary::default();
    let repos: Vec<String> = match &opts.scope.repos {
        Some(r) => r.clone(),
        None if lake.has_table(super::PR_TIMELINE).await? => {
            let ctx = lake.session().await?;
            crate::query::rows(&ctx, "SELECT DISTINCT repo_name FROM pr_timeline ORDER BY repo_name").await?
        }
        // A lake with no PR yet and no repos file: nothing to read is an answer, not an error.
        None => {
            tracing::info!("no repositories to read: no --repos-file, and no PR events in the lake yet");
            return Ok(summary);
        }
    };
    let repos: Vec<String> = repos.into_iter().filter(|r| opts.scope.shard.is_none_or(|s| s.owns(r))).collect();
    summary.repos = repos.len();
    let done = runs::latest_ok(lake, JOB).await?;
    let known: HashMap<String, String> = done
        .iter()
        .filter_map(|(k, r)| Some((k.clone(), r.detail.get("fingerprint")?.as_str()?.to_string())))
        .collect();
    let known = Arc::new(known);

    let mp = crate::progress::multi(opts.scope.show_progress);
    let bar = mp.add(crate::progress::count_bar(repos.len() as u64, "repositories"));
    let mut stream = futures::stream::iter(repos.into_iter().map(|repo| {
        let opts = opts.clone();
        let known = known.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let outcome = match opts.scope.mirrors.refresh(&repo) {
                    Err(f) => Outcome::Failed(f),
                    Ok(r) => {
                        let fp = refs_fingerprint(&r).unwrap_or_default();
                        if !opts.scope.force && known.get(&repo) == Some(&fp) {
                            Outcome::Unchanged
                        } else {
                            let started = std::time::Instant::now();
                            match scan(&r) {
                                Ok(scan) => {
                                    Outcome::Scanned { scan, fingerprint: fp, seconds: started.elapsed().as_secs_f64() }
                                }
                                Err(f) => Outcome::Failed(f),
                            }
                        }
                    }
                };
                (repo, outcome)
            })
            .await
            .context("a git reader panicked")
        }
    }))
    .buffer_unordered(opts.scope.threads.max(1));
    while let Some(r) = stream.next().await {
        let (repo, outcome) = r?;
        match outcome {
            Outcome::Unchanged => summary.repos_unchanged += 1,
            Outcome::Failed(f) => {
                tracing::warn!(repo = %repo, reason = f.reason, "{}", f.message);
                *summary.failures_by_reason.entry(f.reason.to_string()).or_default() += 1;
                let mut rec = RunRecord::ok(
                    JOB,
                    &repo,
                    0,
                    0,
                    0,
                    None,
                    serde_json::json!({"error": crate::lake::store::redact(&f.message), "reason": f.reason}),
                );
                rec.status = "failed".into();
                runs::record(lake, rec).await?;
            }
            Outcome::Scanned { scan, fingerprint, seconds } => {
                let changed = write_repo(lake, &repo, &scan)
                    .await
                    .with_context(|| format!("writing {PR_GIT_FACTS} of {repo}"))?;
                summary.commits += scan.commits;
                summary.prs += scan.prs.len();
                summary.prs_new_or_changed += changed;
                summary.ambiguous += scan.ambiguous;
                summary.scan_seconds += seconds;
                for p in &scan.prs {
                    *summary.prs_by_kind.entry(p.kind.name().to_string()).or_default() += 1;
                }
                let detail = serde_json::json!({
                    "fingerprint": fingerprint, "commits": scan.commits, "prs": scan.prs.len(),
                    "new_or_changed": changed, "default_branch": scan.default_branch,
                });
                runs::record(
                    lake,
                    RunRecord::ok(JOB, &repo, scan.commits as u64, scan.prs.len() as u64, 0, None, detail)
                        .timed(seconds),
                )
                .await?;
                summary.repos_scanned.push(repo);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    summary.repos_scanned.sort();
    Ok(summary)
}

/// Replaces the facts of `repo` with `scan`'s, keeping the `found_at` of facts that did not
/// change. Returns how many are new or changed.
async fn write_repo(lake: &Lake, repo: &str, scan: &Scan) -> Result<usize> {
    let mut before: HashMap<i64, Existing> = HashMap::new();
    if lake.has_table(PR_GIT_FACTS).await? {
        let ctx = lake.session().await?;
        let rows: Vec<Existing> = crate::query::rows(
            &ctx,
            &format!(
                "SELECT number, base_sha, head_sha, merge_commit_sha, title, body, CAST(found_at AS BIGINT) AS found_at \
                 FROM {PR_GIT_FACTS} WHERE repo_name = {}",
                quote(repo)
            ),
        )
        .await?;
        before = rows.into_iter().map(|r| (r.number, r)).collect();
    }
    let now = chrono::Utc::now().timestamp_micros();
    let mut changed = 0;
    let mut rows = Vec::with_capacity(scan.prs.len());
    for p in &scan.prs {
        let (base, head, merge) = (p.base.to_string(), p.head.to_string(), p.merge_commit.to_string());
        let found_at = match before.get(&p.number) {
            Some(e)
                if e.base_sha == base
                    && e.head_sha == head
                    && e.merge_commit_sha == merge
                    && e.title == p.title
                    && e.body == p.body =>
            {
                e.found_at
            }
            _ => {
                changed += 1;
                now
            }
        };
        let row = serde_json::json!({
            "repo_name": repo,
            "number": p.number,
            "kind": p.kind.name(),
            "kinds": p.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "merged": true,
            "merged_at": p.merged_at * 1_000_000,
            "base_sha": base,
            "head_sha": head,
            "merge_commit_sha": merge,
            "base_ref": p.on_first_parent.then_some(&scan.default_branch),
            "head_ref": p.head_ref,
            "head_owner": p.head_owner,
            "title": p.title,
            "body": p.body,
            "author_name": p.author_name,
            "author_email": p.author_email,
            "author_login": p.author_email.as_deref().and_then(login_of_email),
            "on_first_parent": p.on_first_parent,
            "default_branch": scan.default_branch,
            "found_at": found_at,
        });
        rows.push(row);
    }
    let batch = crate::lake::rows::to_batch(PR_GIT_FACTS, &rows)?;
    let key = file_key(repo);
    let mut table = lake.ensure_contract_table(PR_GIT_FACTS).await?;
    let mut w = TableWriter::new(
        lake,
        PR_GIT_FACTS,
        &key,
        &batch.schema(),
        None,
        writer_properties(&["body"], &[], Codec::Zstd),
    )?;
    w.write(&batch)?;
    let files = w.finish()?;
    lake.replace_key(&mut table, &key, files, format!("repo_name = {}", quote(repo)), HashMap::new()).await?;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_come_only_from_github_no_reply_addresses() {
        assert_eq!(login_of_email("12345+octo-cat@users.noreply.github.com").as_deref(), Some("octo-cat"));
        assert_eq!(login_of_email("octo@users.noreply.github.com").as_deref(), Some("octo"));
        assert_eq!(
            login_of_email("49699333+dependabot[bot]@users.noreply.github.com").as_deref(),
            Some("dependabot[bot]")
        );
        assert_eq!(login_of_email("octo@example.com"), None);
        assert_eq!(login_of_email("noreply@github.com"), None);
    }

    #[test]
    fn titles_and_bodies_are_split_at_the_first_line() {
        assert_eq!(title_and_body("\n\nFix it\n\nBecause.\n"), (Some("Fix it".into()), Some("Because.".into())));
        assert_eq!(title_and_body(""), (None, None));
        let m = SQUASH_SUFFIX.captures("Fix the parser (#123)").unwrap();
        assert_eq!((&m[1], &m[2]), ("Fix the parser", "123"));
        assert!(SQUASH_SUFFIX.captures("Revert \"Fix (#12)\"").is_none());
    }
}
