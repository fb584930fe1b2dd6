//! The second source of events: GitHub's REST API, for the repositories a lake follows
//! (`swelake ingest --github --repos-file F`). GH Archive lost PR bodies in 2025-10 and misses
//! a growing share of events; the API still serves the text.
//!
//! Per repository it reads GitHub's REST v3 lists — the repository (its id, its current name),
//! `pulls?state=all&sort=updated&direction=desc` (until the watermark), `issues?since=` and
//! `issues/comments?since=`, `pulls/comments?since=` (review comments) and, with `--reviews`,
//! each changed PR's `pulls/{n}/reviews` — and writes what it read as **events of the
//! archive's shape**: a `PullRequestEvent` `opened` (at the PR's creation) and `closed` (at its
//! close, `merged` set from `merged_at`: the list's "simple" objects have no `merged` field),
//! `IssuesEvent` `opened`/`closed`, `IssueCommentEvent` `created`,
//! `PullRequestReviewCommentEvent` `created`, `PullRequestReviewEvent` `created`, each with the
//! API's object as its payload. So every SQL job, the PR tables and the seed read them
//! unchanged. Reviews are opt-in: GitHub lists them per PR only, a call per changed PR, where
//! the other lists cost a call per 100 changed objects.
//!
//! Ids are `api-<kind>-<object id>-<action>`: stable across reruns and never an archive id
//! (those are numbers). Each object's events carry `source_file =
//! github_api/<owner>/<name>/<kind>/<number or id>`, and a rerun that reads an object again
//! replaces exactly its events (an issue reopened loses its `closed` event), in one commit per
//! repository. `events.source` says `github_api`.
//!
//! Incremental: `github_api_repos` keeps per repository the newest `updated_at` read (the
//! watermark: the next run asks `since` it) and the ETag of each list's first page (a list
//! that did not change answers 304, which costs no quota). A repository that 404s is a row
//! with that status; a renamed one is read under its new name and says so.

pub mod client;
mod convert;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::batch::{ClusteredEvents, EVENTS, EVENTS_SCHEMA, EVENT_DATE, LONG_TEXT_COLUMNS, REPEATED_TEXT_COLUMNS};
use super::event::parse_line;
use crate::lake::rows::to_batch;
use crate::lake::{writer_properties, Lake, TableWriter};
use client::{Answer, Client, Stop};

pub use super::batch::SOURCE_PREFIX;
pub use crate::archive::api_sources::GITHUB_API_REPOS;

/// Settings of one `ingest --github` run.
#[derive(Debug, Clone)]
pub struct GithubOptions {
    pub repos: Vec<String>,
    pub api_url: String,
    /// The environment variable that holds the token.
    pub token_env: String,
    /// Lower bound of `updated_at` for a repository without a watermark (RFC 3339).
    pub since: Option<String>,
    /// Events after this time are not written (RFC 3339).
    pub until: Option<String>,
    pub max_calls: u64,
    /// Also read each changed PR's reviews (a call per PR).
    pub reviews: bool,
    pub show_progress: bool,
}

/// A row of `github_api_repos`: what the API gave for one repository, over all runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RepoState {
    pub repo_name: String,
    /// ok | not_found | stopped | failed.
    pub status: String,
    pub reason: String,
    /// The name GitHub serves the repository under now (a rename shows here).
    pub current_name: String,
    pub repo_id: Option<i64>,
    /// The newest `updated_at` read (RFC 3339): the next run asks for what changed since.
    pub watermark: String,
    /// `url<TAB>etag` of each list's first page.
    pub etags: Vec<String>,
    pub calls_last_run: i64,
    pub not_modified_last_run: i64,
    pub calls_total: i64,
    pub prs_last_run: i64,
    pub issues_last_run: i64,
    pub comments_last_run: i64,
    pub prs_total: i64,
    pub issues_total: i64,
    pub comments_total: i64,
    pub quota_remaining: Option<i64>,
    pub last_run_at: String,
    /// The owning organization as the repository's object gave it (none for a user's
    /// repository): kept, so events made after a 304 on the repository still carry it.
    #[serde(default)]
    pub org_id: Option<i64>,
    #[serde(default)]
    pub org_login: Option<String>,
    /// PR reviews read by the last run (`--reviews`; PullRequestReviewEvents). NULL in rows
    /// written before the column existed.
    #[serde(default)]
    pub reviews_last_run: Option<i64>,
    #[serde(default)]
    pub reviews_total: Option<i64>,
}

/// What a run did, per repository and in all.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GithubSummary {
    pub repos: Vec<RepoState>,
    pub calls: u64,
    pub not_modified: u64,
    pub retries: u64,
    pub events_written: u64,
    /// Why the run stopped early (budget, rate limit), if it did.
    pub stopped: Option<String>,
    pub quota_remaining: Option<i64>,
    pub seconds: f64,
}

impl GithubSummary {
    pub fn render_text(&self) -> String {
        let mut s = format!(
            "{:<40} {:>6} {:>5} {:>6} {:>7} {:>9}  {}\n",
            "repository", "calls", "304s", "PRs", "issues", "comments", "status"
        );
        for r in &self.repos {
            let status = if r.reason.is_empty() { r.status.clone() } else { format!("{}: {}", r.status, r.reason) };
            s.push_str(&format!(
                "{:<40} {:>6} {:>5} {:>6} {:>7} {:>9}  {}\n",
                r.repo_name,
                r.calls_last_run,
                r.not_modified_last_run,
                r.prs_last_run,
                r.issues_last_run,
                r.comments_last_run,
                status
            ));
        }
        s.push_str(&format!(
            "{} calls ({} answered 304, {} retried), {} events written, quota left {}, in {:.1}s\n",
            self.calls,
            self.not_modified,
            self.retries,
            self.events_written,
            self.quota_remaining.map_or("unknown".to_string(), |q| q.to_string()),
            self.seconds
        ));
        if let Some(why) = &self.stopped {
            s.push_str(&format!("stopped early: {why}\n"));
        }
        s
    }
}

/// Reads every repository of `opts` through the API into `events` and `github_api_repos`.
pub async fn run(lake: &Lake, opts: &GithubOptions) -> Result<GithubSummary> {
    let started = Instant::now();
    let token = std::env::var(&opts.token_env).ok().filter(|t| !t.trim().is_empty());
    if token.is_none() {
        eprintln!(
            "warning: ${} is not set: GitHub allows 60 unauthenticated calls an hour (5,000 with a token)",
            opts.token_env
        );
    }
    let mut client = Client::new(&opts.api_url, token, &opts.token_env, opts.max_calls)?;
    let mut states = load_states(lake).await?;
    let mut events_table = lake.ensure_table(EVENTS, &EVENTS_SCHEMA, &[EVENT_DATE]).await?;
    let mut summary = GithubSummary::default();
    for (i, repo) in opts.repos.iter().enumerate() {
        let mut st = states.remove(repo).unwrap_or_else(|| RepoState { repo_name: repo.clone(), ..Default::default() });
        let calls0 = client.calls;
        let nm0 = client.not_modified;
        let outcome = read_repo(&mut client, repo, &mut st, opts).await;
        st.calls_last_run = (client.calls - calls0) as i64;
        st.not_modified_last_run = (client.not_modified - nm0) as i64;
        st.calls_total += st.calls_last_run;
        st.quota_remaining = client.quota_remaining;
        st.last_run_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut stop = None;
        match outcome {
            Ok(Some(read)) => {
                let written = write_events(lake, &mut events_table, repo, &read).await?;
                summary.events_written += written;
                st.prs_last_run = read.prs as i64;
                st.issues_last_run = read.issues as i64;
                st.comments_last_run = read.comments as i64;
                st.reviews_last_run = Some(read.reviews as i64);
                st.reviews_total = Some(st.reviews_total.unwrap_or(0) + read.reviews as i64);
                st.prs_total += st.prs_last_run;
                st.issues_total += st.issues_last_run;
                st.comments_total += st.comments_last_run;
                if let Some(w) = read.watermark {
                    st.watermark = w;
                }
                st.status = "ok".into();
                st.reason.clear();
            }
            Ok(None) => {
                st.status = "not_found".into();
                st.reason = "GitHub answered 404: the repository does not exist or the token cannot see it".into();
                st.prs_last_run = 0;
                st.issues_last_run = 0;
                st.comments_last_run = 0;
                st.reviews_last_run = Some(0);
            }
            Err(e) => {
                (st.prs_last_run, st.issues_last_run, st.comments_last_run) = (0, 0, 0);
                st.reviews_last_run = Some(0);
                match e.downcast_ref::<Stop>() {
                    Some(s) => {
                        st.status = "stopped".into();
                        st.reason = s.to_string();
                        stop = Some(s.to_string());
                    }
                    None => {
                        st.status = "failed".into();
                        st.reason = one_line(&format!("{e:#}"));
                    }
                }
            }
        }
        if opts.show_progress {
            eprintln!(
                "github {repo} ({}/{}): {} — {} calls, {} PRs, {} issues, {} comments",
                i + 1,
                opts.repos.len(),
                if st.reason.is_empty() { st.status.clone() } else { format!("{}: {}", st.status, st.reason) },
                st.calls_last_run,
                st.prs_last_run,
                st.issues_last_run,
                st.comments_last_run
            );
        }
        save_state(lake, &st).await?;
        summary.repos.push(st);
        if let Some(s) = stop {
            summary.stopped = Some(s);
            break;
        }
    }
    summary.calls = client.calls;
    summary.not_modified = client.not_modified;
    summary.retries = client.retries;
    summary.quota_remaining = client.quota_remaining;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// What one repository's lists gave.
#[derive(Default)]
struct Read {
    /// Per object (its `source_file`): its events as archive-shaped JSON lines.
    objects: BTreeMap<String, Vec<String>>,
    prs: usize,
    issues: usize,
    /// Issue, PR and review comments.
    comments: usize,
    reviews: usize,
    watermark: Option<String>,
}

/// Reads one repository's lists; `Ok(None)` when it is not there.
async fn read_repo(client: &mut Client, repo: &str, st: &mut RepoState, opts: &GithubOptions) -> Result<Option<Read>> {
    let mut etags: HashMap<String, String> =
        st.etags.iter().filter_map(|l| l.split_once('\t')).map(|(u, e)| (u.to_string(), e.to_string())).collect();
    // The repository: its id, and its current name (a rename answers under the new one).
    let url = client.url(&format!("/repos/{repo}"));
    let meta = match client.get(&url, etags.get(&url).map(String::as_str)).await? {
        Answer::NotFound => return Ok(None),
        Answer::NotModified => Value::Null,
        Answer::Data { body, etag, .. } => {
            if let Some(e) = etag {
                etags.insert(url.clone(), e);
            }
            body
        }
    };
    let known = if st.current_name.is_empty() { repo } else { st.current_name.as_str() };
    let current = meta.get("full_name").and_then(Value::as_str).unwrap_or(known).to_string();
    st.current_name = current.clone();
    st.repo_id = meta.get("id").and_then(Value::as_i64).or(st.repo_id);
    let repo_ref = json!({
        "id": st.repo_id,
        "name": repo,
        "url": format!("https://api.github.com/repos/{repo}"),
    });
    if let Some(owner) = meta.get("owner") {
        let org = owner.get("type").and_then(Value::as_str) == Some("Organization");
        st.org_id = owner.get("id").and_then(Value::as_i64).filter(|_| org);
        st.org_login = owner.get("login").and_then(Value::as_str).filter(|_| org).map(str::to_string);
    }
    let org = st.org_login.as_ref().map(|login| json!({"id": st.org_id, "login": login}));
    let since = if st.watermark.is_empty() { opts.since.clone() } else { Some(st.watermark.clone()) };
    let mut read = Read::default();
    let mut newest: Option<String> = None;
    let mut note = |t: Option<&str>| {
        if let Some(t) = t {
            if newest.as_deref().is_none_or(|n| t > n) {
                newest = Some(t.to_string());
            }
        }
    };
    let ctx = convert::Ctx { repo: repo_ref, org, until: opts.until.clone() };

    // Pull requests, newest update first, until the watermark.
    let first = client.url(&format!("/repos/{current}/pulls?state=all&sort=updated&direction=desc&per_page=100"));
    let mut pr_numbers = std::collections::BTreeSet::new();
    // The PRs read this run, as their events carry them: review events carry them too.
    let mut pr_objects: BTreeMap<i64, Value> = BTreeMap::new();
    for item in list(client, &first, &mut etags, |item| {
        since.as_deref().is_some_and(|s| item.get("updated_at").and_then(Value::as_str).is_some_and(|u| u < s))
    })
    .await?
    {
        note(item.get("updated_at").and_then(Value::as_str));
        let n = item.get("number").and_then(Value::as_i64).unwrap_or(0);
        pr_numbers.insert(n);
        read.objects.insert(format!("{SOURCE_PREFIX}{repo}/pr/{n}"), convert::pr_events(&ctx, &item));
        pr_objects.insert(n, convert::pr_object(&item));
        read.prs += 1;
    }
    // Issues (the list holds PRs too, as issues: those are read above).
    let since_q = since.as_deref().map(|s| format!("&since={s}")).unwrap_or_default();
    let first =
        client.url(&format!("/repos/{current}/issues?state=all&sort=updated&direction=asc&per_page=100{since_q}"));
    let mut issue_objects: HashMap<i64, Value> = HashMap::new();
    for item in list(client, &first, &mut etags, |_| false).await? {
        note(item.get("updated_at").and_then(Value::as_str));
        let n = item.get("number").and_then(Value::as_i64).unwrap_or(0);
        issue_objects.insert(n, item.clone());
        if item.get("pull_request").is_some() {
            pr_numbers.insert(n);
            continue;
        }
        read.objects.insert(format!("{SOURCE_PREFIX}{repo}/issue/{n}"), convert::issue_events(&ctx, &item));
        read.issues += 1;
    }
    // Comments on issues and PRs.
    let first =
        client.url(&format!("/repos/{current}/issues/comments?sort=updated&direction=asc&per_page=100{since_q}"));
    for item in list(client, &first, &mut etags, |_| false).await? {
        note(item.get("updated_at").and_then(Value::as_str));
        let id = item.get("id").and_then(Value::as_i64).unwrap_or(0);
        let number = number_of(item.get("issue_url"));
        let on_pr = pr_numbers.contains(&number)
            || item.get("html_url").and_then(Value::as_str).is_some_and(|u| u.contains("/pull/"));
        read.objects.insert(
            format!("{SOURCE_PREFIX}{repo}/comment/{id}"),
            convert::comment_events(&ctx, &item, number, on_pr, issue_objects.get(&number)),
        );
        read.comments += 1;
    }
    // Review comments: one list for the whole repository (a new one also moves its PR's
    // `updated_at`, so its PR was read above).
    let first =
        client.url(&format!("/repos/{current}/pulls/comments?sort=updated&direction=asc&per_page=100{since_q}"));
    for item in list(client, &first, &mut etags, |_| false).await? {
        note(item.get("updated_at").and_then(Value::as_str));
        let id = item.get("id").and_then(Value::as_i64).unwrap_or(0);
        let number = number_of(item.get("pull_request_url"));
        read.objects.insert(
            format!("{SOURCE_PREFIX}{repo}/review_comment/{id}"),
            convert::review_comment_events(&ctx, &item, number, pr_objects.get(&number)),
        );
        read.comments += 1;
    }
    // Reviews have no repository-wide list: a call per PR read this run, when asked. Their
    // ETags are not kept (one per PR would grow without bound; a changed PR's list changed).
    if opts.reviews {
        let mut no_etags = HashMap::new();
        for (n, pr) in &pr_objects {
            let first = client.url(&format!("/repos/{current}/pulls/{n}/reviews?per_page=100"));
            for item in list(client, &first, &mut no_etags, |_| false).await? {
                let id = item.get("id").and_then(Value::as_i64).unwrap_or(0);
                read.objects
                    .insert(format!("{SOURCE_PREFIX}{repo}/review/{id}"), convert::review_events(&ctx, &item, pr));
                read.reviews += 1;
            }
        }
    }
    st.etags = etags.into_iter().map(|(u, e)| format!("{u}\t{e}")).collect();
    st.etags.sort();
    read.watermark = newest;
    Ok(Some(read))
}

/// The number at the end of an issue's or PR's API URL (0 when there is none).
fn number_of(url: Option<&Value>) -> i64 {
    url.and_then(Value::as_str).and_then(|u| u.rsplit('/').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Every item of a list, page after page by `Link: rel="next"`; a 304 on the first page (its
/// ETag stored) is an empty list. `enough(item)` ends the reading at an item (sorted lists).
async fn list(
    client: &mut Client,
    first: &str,
    etags: &mut HashMap<String, String>,
    enough: impl Fn(&Value) -> bool,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut url = Some(first.to_string());
    while let Some(u) = url.take() {
        let etag = if u == first { etags.get(first).cloned() } else { None };
        match client.get(&u, etag.as_deref()).await? {
            Answer::NotModified | Answer::NotFound => break,
            Answer::Data { body, etag, next } => {
                if u == first {
                    match etag {
                        Some(e) => etags.insert(first.to_string(), e),
                        None => etags.remove(first),
                    };
                }
                let items = body.as_array().cloned().with_context(|| format!("{u} did not answer a list"))?;
                for item in items {
                    if enough(&item) {
                        return Ok(out);
                    }
                    out.push(item);
                }
                url = next;
            }
        }
    }
    Ok(out)
}

/// Writes a repository's objects' events, replacing what earlier runs wrote for the same
/// objects, in one commit.
async fn write_events(lake: &Lake, table: &mut deltalake::DeltaTable, repo: &str, read: &Read) -> Result<u64> {
    if read.objects.is_empty() {
        return Ok(0);
    }
    // The repository's events live in files of one key, which a commit replaces whole: the
    // objects this run did not read again keep their events, read back as the lines they were.
    let mut objects = read.objects.clone();
    for (source_file, line) in held_events(lake, repo).await? {
        if !read.objects.contains_key(&source_file) {
            objects.entry(source_file).or_default().push(line);
        }
    }
    let key = format!("github-api-{}", crate::files::path_segment(repo));
    let mut writer = TableWriter::new(
        lake,
        EVENTS,
        &key,
        &EVENTS_SCHEMA,
        Some(EVENT_DATE),
        writer_properties(LONG_TEXT_COLUMNS, REPEATED_TEXT_COLUMNS, crate::lake::Codec::Zstd),
    )?;
    let mut builder = ClusteredEvents::new(8192);
    let mut written = 0u64;
    for (source_file, lines) in &objects {
        for (i, line) in lines.iter().enumerate() {
            match parse_line(line) {
                Ok(ev) => {
                    builder.push(&ev, source_file, i as u64 + 1);
                    written += 1;
                }
                // Made here from GitHub's object: a failure is this code's, and says which.
                Err(r) => anyhow::bail!("an event made from {source_file} does not parse: {} {}", r.code, r.detail),
            }
        }
    }
    for b in builder.finish() {
        writer.write(&b)?;
    }
    let staged = writer.finish()?;
    let predicate = format!("starts_with(source_file, '{SOURCE_PREFIX}{}/')", repo.replace('\'', "''"));
    let meta = HashMap::from([
        ("swelake.job".to_string(), json!("ingest-github")),
        ("swelake.source_key".to_string(), json!(key)),
    ]);
    lake.replace_key(table, &key, staged, predicate, meta).await?;
    let kept: usize = objects.iter().filter(|(k, _)| !read.objects.contains_key(*k)).map(|(_, v)| v.len()).sum();
    Ok(written - kept as u64)
}

/// The API events a lake holds for `repo`, as (source_file, the event's line in the archive's
/// shape: what [`parse_line`] reads of it), in their order.
async fn held_events(lake: &Lake, repo: &str) -> Result<Vec<(String, String)>> {
    if !lake.has_table(EVENTS).await? {
        return Ok(Vec::new());
    }
    #[derive(Deserialize)]
    struct Held {
        source_file: String,
        id: String,
        r#type: String,
        actor_id: Option<i64>,
        actor_login: Option<String>,
        repo_id: Option<i64>,
        repo_name: Option<String>,
        org_login: Option<String>,
        public: Option<bool>,
        created_at: String,
        payload: String,
    }
    let ctx = lake.session().await?;
    let sql = format!(
        "SELECT source_file, id, type, actor_id, actor_login, repo_id, repo_name, org_login, public, \
         to_char(created_at, '%Y-%m-%dT%H:%M:%SZ') AS created_at, payload FROM {EVENTS} \
         WHERE starts_with(source_file, '{SOURCE_PREFIX}{}/') ORDER BY source_file, source_line",
        repo.replace('\'', "''")
    );
    let rows: Vec<Held> = crate::query::rows(&ctx, &sql).await?;
    let mut out = Vec::with_capacity(rows.len());
    for h in rows {
        let payload: Value = serde_json::from_str(&h.payload).context("an API event's payload")?;
        let mut e = json!({
            "id": h.id,
            "type": h.r#type,
            "actor": {"id": h.actor_id, "login": h.actor_login},
            "repo": {"id": h.repo_id, "name": h.repo_name},
            "payload": payload,
            "public": h.public.unwrap_or(true),
            "created_at": h.created_at,
        });
        if let Some(o) = h.org_login {
            e["org"] = json!({"login": o});
        }
        out.push((h.source_file, e.to_string()));
    }
    Ok(out)
}

async fn load_states(lake: &Lake) -> Result<HashMap<String, RepoState>> {
    if !lake.has_table(GITHUB_API_REPOS).await? {
        return Ok(HashMap::new());
    }
    let ctx = lake.session().await?;
    let rows: Vec<RepoState> = crate::query::rows(&ctx, &format!("SELECT * FROM {GITHUB_API_REPOS}")).await?;
    Ok(rows.into_iter().map(|r| (r.repo_name.clone(), r)).collect())
}

async fn save_state(lake: &Lake, st: &RepoState) -> Result<()> {
    let batch = to_batch(GITHUB_API_REPOS, std::slice::from_ref(st))?;
    let keys = ["repo_name".to_string()];
    let file_key = format!("github-api-{}", crate::files::path_segment(&st.repo_name));
    lake.upsert_rows(GITHUB_API_REPOS, &batch.schema(), &[batch], &keys, None, &file_key).await?;
    Ok(())
}

/// An error as one line of at most 400 characters (a table cell).
fn one_line(s: &str) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match s.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}
