//! Parsing one GH Archive line into a typed event, or into the reason it cannot be ingested.
//!
//! The top level follows the Events API schema (2015 onward). Payloads of the event types the
//! pipeline uses (pull requests, reviews, issues, comments, pushes, refs) are decoded into
//! typed fields so later SQL never re-parses JSON; the raw payload text is kept verbatim.
//! Payloads cut down by GitHub's 2025-10-07 trim (PR stubs, pushes without commits) parse
//! the same way with the missing fields left NULL, and are flagged `payload_trimmed`.
//! Pre-2015 Timeline-schema lines are recognised and rejected, never misparsed.

use std::borrow::Cow;

use serde::Deserialize;

/// Why a line was not ingested: a stable `code` for grouping and a human `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: String,
    pub detail: String,
}

impl Rejection {
    pub fn new(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Rejection { code: code.into(), detail: detail.into() }
    }
}

/// A user-ish object of a payload (`user`, `comment.user`, `review.user`).
#[derive(Debug, Default, Deserialize)]
pub struct User<'a> {
    #[serde(borrow, default)]
    pub login: Option<Cow<'a, str>>,
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Label<'a> {
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RepoRef<'a> {
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(borrow, default)]
    pub full_name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct GitRef<'a> {
    #[serde(borrow, default, rename = "ref")]
    pub ref_name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub sha: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub repo: Option<RepoRef<'a>>,
}

/// `pull_request.merged_at` of an issue object that is a PR.
#[derive(Debug, Default, Deserialize)]
pub struct IssuePrLink<'a> {
    #[serde(borrow, default)]
    pub merged_at: Option<Cow<'a, str>>,
}

/// The common shape of `pull_request` and `issue` objects; every field optional because
/// trimmed stubs carry only a few of them.
#[derive(Debug, Default, Deserialize)]
pub struct Item<'a> {
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(default)]
    pub number: Option<i64>,
    #[serde(borrow, default)]
    pub title: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub body: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub state: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub user: Option<User<'a>>,
    #[serde(borrow, default)]
    pub labels: Option<Vec<Label<'a>>>,
    #[serde(borrow, default)]
    pub author_association: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub created_at: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub closed_at: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub merged_at: Option<Cow<'a, str>>,
    #[serde(default)]
    pub merged: Option<bool>,
    #[serde(borrow, default)]
    pub merge_commit_sha: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub base: Option<GitRef<'a>>,
    #[serde(borrow, default)]
    pub head: Option<GitRef<'a>>,
    #[serde(default)]
    pub commits: Option<i64>,
    #[serde(default)]
    pub additions: Option<i64>,
    #[serde(default)]
    pub deletions: Option<i64>,
    #[serde(default)]
    pub changed_files: Option<i64>,
    #[serde(default)]
    pub comments: Option<i64>,
    #[serde(default)]
    pub draft: Option<bool>,
    /// Present (an object) on issues that are pull requests.
    #[serde(borrow, default)]
    pub pull_request: Option<IssuePrLink<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Comment<'a> {
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(borrow, default)]
    pub body: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub user: Option<User<'a>>,
    #[serde(borrow, default)]
    pub path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub state: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PushCommit<'a> {
    #[serde(borrow, default)]
    pub sha: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub message: Option<Cow<'a, str>>,
}

/// The payload fields any of the typed event kinds may carry.
#[derive(Debug, Default, Deserialize)]
pub struct Payload<'a> {
    #[serde(borrow, default)]
    pub action: Option<Cow<'a, str>>,
    #[serde(default)]
    pub number: Option<i64>,
    #[serde(borrow, default)]
    pub pull_request: Option<Item<'a>>,
    #[serde(borrow, default)]
    pub issue: Option<Item<'a>>,
    #[serde(borrow, default)]
    pub comment: Option<Comment<'a>>,
    #[serde(borrow, default)]
    pub review: Option<Comment<'a>>,
    #[serde(borrow, default, rename = "ref")]
    pub ref_name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub ref_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub head: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub before: Option<Cow<'a, str>>,
    #[serde(default)]
    pub size: Option<i64>,
    #[serde(borrow, default)]
    pub commits: Option<Vec<PushCommit<'a>>>,
    #[serde(borrow, default)]
    pub label: Option<Label<'a>>,
}

#[derive(Deserialize)]
struct Account<'a> {
    #[serde(default)]
    id: Option<i64>,
    #[serde(borrow, default)]
    login: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Repo<'a> {
    #[serde(default)]
    id: Option<i64>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

/// One parsed event, borrowing from its line.
#[derive(Debug)]
pub struct Event<'a> {
    pub id: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub actor_id: Option<i64>,
    pub actor_login: Option<Cow<'a, str>>,
    pub repo_id: Option<i64>,
    pub repo_name: Option<Cow<'a, str>>,
    pub org_login: Option<Cow<'a, str>>,
    pub public: Option<bool>,
    /// Microseconds since the Unix epoch, UTC.
    pub created_at: i64,
    pub payload_raw: &'a str,
    pub payload: Payload<'a>,
    /// The payload lacks fields that the pre-trim Events API always carried.
    pub payload_trimmed: bool,
}

fn is_null(raw: Option<&str>) -> bool {
    raw.is_none_or(|r| r == "null")
}

fn json_kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Classifies a serde error on a member's text: malformed JSON, or well-formed JSON of the
/// wrong shape.
fn span_error(e: serde_json::Error, field: &str, want: &str, raw: &str) -> Rejection {
    if e.is_data() {
        Rejection::new(format!("wrong_type:{field}"), format!("`{field}` must be {want}, got {}: {e}", json_kind(raw)))
    } else {
        Rejection::new("invalid_json", format!("in `{field}`: {e}"))
    }
}

fn required_str<'a>(raw: Option<&'a str>, field: &str) -> Result<Cow<'a, str>, Rejection> {
    let Some(raw) = raw.filter(|r| *r != "null") else {
        return Err(Rejection::new(format!("missing_field:{field}"), format!("`{field}` is missing or null")));
    };
    serde_json::from_str::<Cow<'a, str>>(raw).map_err(|e| span_error(e, field, "a string", raw))
}

fn optional<'a, T: Deserialize<'a>>(raw: Option<&'a str>, field: &str, want: &str) -> Result<Option<T>, Rejection> {
    if is_null(raw) {
        return Ok(None);
    }
    let raw = raw.expect("checked by is_null");
    serde_json::from_str::<T>(raw).map(Some).map_err(|e| span_error(e, field, want, raw))
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` quickly, anything else RFC 3339 through chrono; returns
/// microseconds since the epoch in UTC.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() == 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':' && b[19] == b'Z'
    {
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            b[r].iter().try_fold(0u32, |acc, &c| c.is_ascii_digit().then(|| acc * 10 + (c - b'0') as u32))
        };
        let date = chrono::NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)?;
        let time = chrono::NaiveTime::from_hms_opt(num(11..13)?, num(14..16)?, num(17..19)?)?;
        return Some(date.and_time(time).and_utc().timestamp_micros());
    }
    chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp_micros())
}

/// Event types whose payload is decoded into typed columns.
pub fn has_typed_payload(kind: &str) -> bool {
    matches!(
        kind,
        "PullRequestEvent"
            | "PullRequestReviewEvent"
            | "PullRequestReviewCommentEvent"
            | "PullRequestReviewThreadEvent"
            | "IssuesEvent"
            | "IssueCommentEvent"
            | "PushEvent"
            | "CreateEvent"
            | "DeleteEvent"
    )
}

/// The top-level members swelake reads; every other member is validated and ignored.
#[derive(Default)]
struct Members<'a> {
    id: Option<&'a str>,
    kind: Option<&'a str>,
    actor: Option<&'a str>,
    repo: Option<&'a str>,
    repository: Option<&'a str>,
    org: Option<&'a str>,
    public: Option<&'a str>,
    created_at: Option<&'a str>,
    payload: Option<&'a str>,
    /// The payload, already decoded (typed or validated) while the line was split: the usual
    /// case, where `type` precedes `payload`. `None` leaves it to [`parse_line`].
    payload_parsed: Option<Payload<'a>>,
}

/// The first JSON value of `rest` and the byte offset just past it.
fn decode_prefix<'a, T: Deserialize<'a>>(rest: &'a str) -> Option<(T, usize)> {
    let mut it = serde_json::Deserializer::from_str(rest).into_iter::<T>();
    let value = it.next()?.ok()?;
    Some((value, it.byte_offset()))
}

/// Decodes the payload object starting at `line[start..]` in the one serde pass that also
/// finds where it ends; `None` if that fails (the caller's slower path reports why).
fn payload_in_place<'a>(line: &'a str, start: usize, kind: &str) -> Option<(Payload<'a>, usize)> {
    let rest = &line[start..];
    if !rest.starts_with('{') {
        return None;
    }
    let (payload, len) = if has_typed_payload(kind) {
        decode_prefix::<Payload>(rest)?
    } else {
        decode_prefix::<serde::de::IgnoredAny>(rest).map(|(_, len)| (Payload::default(), len))?
    };
    Some((payload, start + len))
}

fn split_members(line: &str) -> Result<Members<'_>, Rejection> {
    let mut payload_parsed = None;
    let list = super::scan::members_with(line, |so_far, key, start| {
        if key != "payload" {
            return None;
        }
        // Only a plain string `type` seen earlier says which payload shape to decode.
        let kind = so_far.iter().find(|(k, _)| k == "type").map(|(_, v)| *v)?;
        let kind = kind.strip_prefix('"')?.strip_suffix('"').filter(|k| !k.contains('\\'))?;
        let (payload, end) = payload_in_place(line, start, kind)?;
        payload_parsed = Some(payload);
        Some(end)
    })
    .map_err(|e| Rejection::new("invalid_json", e.message))?;
    let mut m = Members::default();
    for (key, value) in list {
        let slot = match key.as_ref() {
            "id" => &mut m.id,
            "type" => &mut m.kind,
            "actor" => &mut m.actor,
            "repo" => &mut m.repo,
            "repository" => &mut m.repository,
            "org" => &mut m.org,
            "public" => &mut m.public,
            "created_at" => &mut m.created_at,
            "payload" => &mut m.payload,
            other => {
                // Not read, but it must still be valid JSON.
                serde_json::from_str::<serde::de::IgnoredAny>(value)
                    .map_err(|e| Rejection::new("invalid_json", format!("in `{other}`: {e}")))?;
                continue;
            }
        };
        if slot.replace(value).is_some() {
            return Err(Rejection::new("invalid_json", format!("duplicate member `{key}`")));
        }
    }
    m.payload_parsed = payload_parsed;
    Ok(m)
}

/// Parses one line (already known to be valid UTF-8 and within the size limit).
pub fn parse_line(line: &str) -> Result<Event<'_>, Rejection> {
    if !line.trim_start().starts_with('{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(line) {
            Ok(_) => Rejection::new("not_an_object", "the line is JSON but not an event object"),
            Err(e) => Rejection::new("invalid_json", e.to_string()),
        });
    }
    let mut m = split_members(line)?;
    let actor_is_string = m.actor.is_some_and(|a| a.starts_with('"'));
    if m.repository.is_some() || actor_is_string {
        return Err(Rejection::new(
            "timeline_schema",
            "pre-2015 GitHub Timeline event (`repository` object / string `actor`); only the Events API schema (2015-01-01 onward) is supported",
        ));
    }
    let id = required_str(m.id, "id")?;
    if id.is_empty() {
        return Err(Rejection::new("missing_field:id", "`id` is empty"));
    }
    let kind = required_str(m.kind, "type")?;
    let created_raw = required_str(m.created_at, "created_at")?;
    let created_at = parse_timestamp(&created_raw).ok_or_else(|| {
        Rejection::new(
            "bad_timestamp:created_at",
            format!("`created_at` is not an RFC 3339 timestamp: {created_raw:?}"),
        )
    })?;
    let actor: Option<Account> = optional(m.actor, "actor", "an object")?;
    let repo: Option<Repo> = optional(m.repo, "repo", "an object")?;
    let org: Option<Account> = optional(m.org, "org", "an object")?;
    let public: Option<bool> = optional(m.public, "public", "a boolean")?;
    let Some(payload_raw) = m.payload.filter(|p| *p != "null") else {
        return Err(Rejection::new("missing_field:payload", "`payload` is missing or null"));
    };
    if !payload_raw.starts_with('{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(payload_raw) {
            Ok(_) => Rejection::new(
                "wrong_type:payload",
                format!("`payload` must be an object, got {}", json_kind(payload_raw)),
            ),
            Err(e) => Rejection::new("invalid_json", format!("in `payload`: {e}")),
        });
    }
    // One serde pass over the payload either way: typed where the columns need it,
    // validation only where they do not.
    let payload: Payload = if let Some(p) = m.payload_parsed.take() {
        p
    } else if has_typed_payload(&kind) {
        serde_json::from_str(payload_raw).map_err(|e| {
            if e.is_data() {
                Rejection::new("bad_payload", format!("{kind} payload does not have the expected field types: {e}"))
            } else {
                Rejection::new("invalid_json", format!("in `payload`: {e}"))
            }
        })?
    } else {
        serde_json::from_str::<serde::de::IgnoredAny>(payload_raw)
            .map_err(|e| Rejection::new("invalid_json", format!("in `payload`: {e}")))?;
        Payload::default()
    };
    let payload_trimmed = match kind.as_ref() {
        "PullRequestEvent" | "PullRequestReviewEvent" | "PullRequestReviewCommentEvent" => payload
            .pull_request
            .as_ref()
            .is_some_and(|pr| pr.user.is_none() && pr.title.is_none() && pr.state.is_none()),
        "PushEvent" => payload.commits.is_none() && payload.size.is_none(),
        _ => false,
    };
    let (actor_id, actor_login) = actor.map_or((None, None), |a| (a.id, a.login));
    let (repo_id, repo_name) = repo.map_or((None, None), |r| (r.id, r.name));
    Ok(Event {
        id,
        kind,
        actor_id,
        actor_login,
        repo_id,
        repo_name,
        org_login: org.and_then(|o| o.login),
        public,
        created_at,
        payload_raw,
        payload,
        payload_trimmed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_api_line() {
        let line = r#"{"id":"1","type":"PullRequestEvent","actor":{"id":5,"login":"al"},"repo":{"id":7,"name":"o/r"},"payload":{"action":"closed","number":3,"pull_request":{"number":3,"title":"Fix \"x\"","user":{"login":"al","type":"User"},"merged":true,"merged_at":"2015-01-01T15:00:00Z","base":{"ref":"main","sha":"b"},"head":{"ref":"f","sha":"h"}}},"public":true,"created_at":"2015-01-01T15:00:01Z"}"#;
        let e = parse_line(line).unwrap();
        assert_eq!(e.id, "1");
        assert_eq!(e.created_at, 1_420_124_401_000_000);
        let pr = e.payload.pull_request.as_ref().unwrap();
        assert_eq!(pr.title.as_deref(), Some("Fix \"x\""));
        assert_eq!(pr.merged, Some(true));
        assert!(!e.payload_trimmed);
        assert!(e.payload_raw.starts_with("{\"action\""));
    }

    #[test]
    fn trimmed_pr_stub_is_flagged_not_rejected() {
        let line = r#"{"id":"9","type":"PullRequestEvent","actor":{"id":1,"login":"a"},"repo":{"id":2,"name":"o/r"},"payload":{"action":"merged","number":4,"pull_request":{"id":11,"number":4,"url":"u","head":{"ref":"f","sha":"h","repo":{"id":2,"url":"u","name":"r"}},"base":{"ref":"main","sha":"b","repo":{"id":2,"url":"u","name":"r"}}}},"public":true,"created_at":"2025-12-01T00:00:00Z"}"#;
        let e = parse_line(line).unwrap();
        assert!(e.payload_trimmed);
        assert_eq!(e.payload.pull_request.as_ref().unwrap().merged, None);
    }

    #[test]
    fn rejections_name_the_problem() {
        let code = |l: &str| parse_line(l).unwrap_err().code;
        assert_eq!(code("{\"id\":\"1\""), "invalid_json");
        assert_eq!(code("[1,2]"), "not_an_object");
        assert_eq!(code(r#"{"type":"X","created_at":"2015-01-01T00:00:00Z","payload":{}}"#), "missing_field:id");
        assert_eq!(code(r#"{"id":5,"type":"X","created_at":"2015-01-01T00:00:00Z","payload":{}}"#), "wrong_type:id");
        assert_eq!(code(r#"{"id":"5","type":"X","created_at":"yesterday","payload":{}}"#), "bad_timestamp:created_at");
        assert_eq!(
            code(
                r#"{"repository":{"name":"r"},"actor":"bob","type":"PushEvent","created_at":"2012-03-10T22:34:47-08:00","payload":{}}"#
            ),
            "timeline_schema"
        );
        assert_eq!(
            code(
                r#"{"id":"5","type":"IssuesEvent","created_at":"2015-01-01T00:00:00Z","payload":{"issue":{"number":"x"}}}"#
            ),
            "bad_payload"
        );
    }

    /// The payload is decoded while the line is split when `type` comes first (real archives),
    /// afterwards otherwise; both give the same event and the same rejections.
    #[test]
    fn member_order_does_not_matter() {
        let payload = r#"{"action":"opened","number":3,"pull_request":{"number":3,"title":"T","user":{"login":"al","type":"User"},"head":{"ref":"f","sha":"h"}}}"#;
        let first = format!(
            r#"{{"id":"1","type":"PullRequestEvent","payload":{payload},"public":true,"created_at":"2015-01-01T15:00:01Z"}}"#
        );
        let last = format!(
            r#"{{"id":"1","payload":{payload},"public":true,"created_at":"2015-01-01T15:00:01Z","type":"PullRequestEvent"}}"#
        );
        for line in [&first, &last] {
            let e = parse_line(line).unwrap();
            assert_eq!(e.payload_raw, payload);
            assert_eq!(e.payload.action.as_deref(), Some("opened"));
            let pr = e.payload.pull_request.as_ref().unwrap();
            assert_eq!(pr.user.as_ref().unwrap().login.as_deref(), Some("al"));
            assert_eq!(pr.head.as_ref().unwrap().sha.as_deref(), Some("h"));
        }
        for (bad, code) in [
            (r#"{"number":"x"}"#, "bad_payload"),
            (r#"{"number":3,}"#, "invalid_json"),
            (r#"{"a":[1,2}"#, "invalid_json"),
        ] {
            for line in [
                format!(r#"{{"id":"1","type":"IssuesEvent","payload":{bad},"created_at":"2015-01-01T15:00:01Z"}}"#),
                format!(r#"{{"id":"1","payload":{bad},"created_at":"2015-01-01T15:00:01Z","type":"IssuesEvent"}}"#),
            ] {
                assert_eq!(parse_line(&line).unwrap_err().code, code, "{line}");
            }
        }
        // An untyped event's payload is validated, not decoded, on either path.
        let watch =
            r#"{"id":"2","type":"WatchEvent","payload":{"action":"started"},"created_at":"2015-01-01T15:00:01Z"}"#;
        let e = parse_line(watch).unwrap();
        assert_eq!(e.payload_raw, r#"{"action":"started"}"#);
        assert!(e.payload.action.is_none());
        let broken =
            r#"{"id":"2","type":"WatchEvent","payload":{"action":"started"]},"created_at":"2015-01-01T15:00:01Z"}"#;
        assert_eq!(parse_line(broken).unwrap_err().code, "invalid_json");
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:01Z"), Some(1_000_000));
        assert_eq!(parse_timestamp("1970-01-01T01:00:01+01:00"), Some(1_000_000));
        assert_eq!(parse_timestamp("2015-02-30T00:00:00Z"), None);
    }
}
