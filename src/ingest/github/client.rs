//! A GitHub REST v3 client that behaves as GitHub asks API clients to: pages followed by their
//! `Link: rel="next"` (never guessed), conditional requests with the stored ETag (a 304 costs
//! no quota), the primary rate limit respected (`x-ratelimit-remaining`/`reset`: wait when the
//! reset is near, else stop with a clear message), secondary limits (403/429 with
//! `retry-after`) and 5xx answers retried with backoff, a budget of calls. The token goes into
//! the `Authorization` header and nowhere else: no log line, error or table holds it.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, ETAG, IF_NONE_MATCH, LINK, RETRY_AFTER, USER_AGENT};
use reqwest::StatusCode;
use serde_json::Value;

/// What a GET answered.
#[derive(Debug)]
pub enum Answer {
    /// 200: the JSON body, its ETag, the next page.
    Data { body: Value, etag: Option<String>, next: Option<String> },
    /// 304: nothing changed since the ETag.
    NotModified,
    /// 404 or 410: the repository (or object) is not there, or not visible to the token.
    NotFound,
}

/// Why a run stopped before its work was done; the repositories left are done by a rerun.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// `--max-calls` is spent.
    Budget(u64),
    /// The primary rate limit is spent until this UTC epoch second.
    RateLimited(i64),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Budget(n) => write!(f, "the call budget (--max-calls {n}) is spent; a rerun goes on from here"),
            Stop::RateLimited(reset) => {
                let at = chrono::DateTime::from_timestamp(*reset, 0).map(|t| t.to_rfc3339()).unwrap_or_default();
                write!(f, "GitHub's rate limit is spent until {at}; a rerun after that goes on from here")
            }
        }
    }
}

impl std::error::Error for Stop {}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Where the token came from (`$GITHUB_TOKEN`), for messages.
    token_name: String,
    pub max_calls: u64,
    /// Calls made (every answer counts, 304s included; GitHub does not charge those to the
    /// rate limit).
    pub calls: u64,
    pub not_modified: u64,
    pub retries: u64,
    pub quota_remaining: Option<i64>,
    pub quota_reset: Option<i64>,
    /// The longest wait for a limit before stopping instead.
    pub max_wait: Duration,
    /// The first wait before retrying a 5xx or a failed connection (doubled each time).
    pub backoff: Duration,
}

impl Client {
    pub fn new(base: &str, token: Option<String>, token_name: &str, max_calls: u64) -> Result<Client> {
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(60)).build().context("building the HTTP client")?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
            token_name: token_name.to_string(),
            max_calls,
            calls: 0,
            not_modified: 0,
            retries: 0,
            quota_remaining: None,
            quota_reset: None,
            max_wait: Duration::from_secs(15 * 60),
            backoff: Duration::from_millis(500),
        })
    }

    /// The URL of an API path (`/repos/o/r/pulls?…`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GETs `url` (with `If-None-Match: etag` when given), waiting out limits and retrying
    /// server errors; a [`Stop`] (inside the error) ends the run politely.
    pub async fn get(&mut self, url: &str, etag: Option<&str>) -> Result<Answer> {
        let mut attempt = 0u32;
        loop {
            if self.calls >= self.max_calls {
                return Err(Stop::Budget(self.max_calls).into());
            }
            let mut req = self
                .http
                .get(url)
                .header(ACCEPT, "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28")
                .header(USER_AGENT, concat!("swelake/", env!("CARGO_PKG_VERSION")));
            if let Some(t) = &self.token {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            if let Some(e) = etag {
                req = req.header(IF_NONE_MATCH, e);
            }
            self.calls += 1;
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if attempt < 4 => {
                    tracing::warn!(url, error = %e.without_url(), "GitHub did not answer; retrying");
                    self.wait_backoff(&mut attempt).await;
                    continue;
                }
                Err(e) => bail!("GitHub did not answer {}: {}", path_of(url), e.without_url()),
            };
            let status = resp.status();
            let headers = resp.headers().clone();
            self.note_quota(&headers);
            match status {
                StatusCode::NOT_MODIFIED => {
                    self.not_modified += 1;
                    return Ok(Answer::NotModified);
                }
                StatusCode::NOT_FOUND | StatusCode::GONE => return Ok(Answer::NotFound),
                StatusCode::UNAUTHORIZED => bail!(
                    "GitHub answered 401 Unauthorized for {}: {} (set a valid token in ${})",
                    path_of(url),
                    if self.token.is_some() { "the token was refused" } else { "no token was given" },
                    self.token_name
                ),
                s if s.is_success() => {
                    let etag = header(&headers, ETAG.as_str());
                    let next = header(&headers, LINK.as_str()).and_then(|l| next_link(&l));
                    let bytes = resp.bytes().await.with_context(|| format!("reading {}", path_of(url)))?;
                    let body: Value = serde_json::from_slice(&bytes)
                        .with_context(|| format!("GitHub's answer to {} is not JSON", path_of(url)))?;
                    return Ok(Answer::Data { body, etag, next });
                }
                StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS => {
                    let text = resp.text().await.unwrap_or_default();
                    if let Some(secs) =
                        header(&headers, RETRY_AFTER.as_str()).and_then(|v| v.trim().parse::<u64>().ok())
                    {
                        // A secondary limit: GitHub says how long to wait.
                        let wait = Duration::from_secs(secs);
                        if wait > self.max_wait {
                            bail!("GitHub asks to wait {secs} s before {} (a secondary rate limit)", path_of(url));
                        }
                        tracing::warn!(seconds = secs, "GitHub's secondary rate limit: waiting as it asks");
                        self.retries += 1;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    if self.quota_remaining == Some(0) {
                        let reset = self.quota_reset.unwrap_or(0);
                        let now = chrono::Utc::now().timestamp();
                        let wait = Duration::from_secs((reset - now).max(0) as u64 + 1);
                        if wait > self.max_wait {
                            return Err(Stop::RateLimited(reset).into());
                        }
                        tracing::warn!(seconds = wait.as_secs(), "GitHub's rate limit is spent: waiting for its reset");
                        self.retries += 1;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    bail!("GitHub answered {status} for {}: {}", path_of(url), message_of(&text));
                }
                s if s.is_server_error() && attempt < 4 => {
                    tracing::warn!(status = %s, url = path_of(url), "GitHub answered a server error; retrying");
                    self.wait_backoff(&mut attempt).await;
                }
                s => {
                    let text = resp.text().await.unwrap_or_default();
                    bail!("GitHub answered {s} for {}: {}", path_of(url), message_of(&text));
                }
            }
        }
    }

    async fn wait_backoff(&mut self, attempt: &mut u32) {
        self.retries += 1;
        tokio::time::sleep(self.backoff * 2u32.pow(*attempt)).await;
        *attempt += 1;
    }

    fn note_quota(&mut self, h: &HeaderMap) {
        if let Some(v) = header(h, "x-ratelimit-remaining").and_then(|v| v.parse().ok()) {
            self.quota_remaining = Some(v);
        }
        if let Some(v) = header(h, "x-ratelimit-reset").and_then(|v| v.parse().ok()) {
            self.quota_reset = Some(v);
        }
    }
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The path and query of a URL, for messages (the host is the user's own setting).
fn path_of(url: &str) -> &str {
    url.find("://").and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..])).unwrap_or(url)
}

/// GitHub's `message` of an error body, else the body's start.
fn message_of(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| text.chars().take(200).collect())
}

/// The `rel="next"` URL of a `Link` header.
pub fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| url.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_the_one_link_names() {
        let link = "<https://api.github.com/repositories/1/pulls?page=3&per_page=100>; rel=\"next\", \
                    <https://api.github.com/repositories/1/pulls?page=9&per_page=100>; rel=\"last\"";
        assert_eq!(next_link(link).as_deref(), Some("https://api.github.com/repositories/1/pulls?page=3&per_page=100"));
        assert_eq!(next_link("<https://x/y?page=1>; rel=\"prev\""), None);
        assert_eq!(path_of("https://api.github.com/repos/o/r/pulls?x=1"), "/repos/o/r/pulls?x=1");
    }
}
