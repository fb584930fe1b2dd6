//! REST objects → events of GH Archive's shape (the Events API's: `id`, `type`, `actor`,
//! `repo`, `org`, `payload`, `public`, `created_at`), with the object itself in the payload.

use serde_json::{json, Value};

/// What every event of a repository shares.
pub struct Ctx {
    pub repo: Value,
    pub org: Option<Value>,
    /// Events after this time are left out.
    pub until: Option<String>,
}

impl Ctx {
    fn event(&self, id: String, kind: &str, actor: Option<&Value>, at: &str, payload: Value) -> Option<String> {
        if self.until.as_deref().is_some_and(|u| at > u) {
            return None;
        }
        let actor = actor.filter(|a| !a.is_null()).map(|a| {
            json!({"id": a.get("id"), "login": a.get("login"), "url": a.get("url"), "avatar_url": a.get("avatar_url")})
        });
        let mut e = json!({
            "id": id,
            "type": kind,
            "actor": actor,
            "repo": self.repo,
            "payload": payload,
            "public": true,
            "created_at": at,
        });
        if let Some(o) = &self.org {
            e["org"] = o.clone();
        }
        Some(e.to_string())
    }
}

fn s<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// A PR of the pulls list as the archive's payloads carry it: with `merged` (set when
/// `merged_at` is).
pub fn pr_object(pr: &Value) -> Value {
    let mut obj = pr.clone();
    if obj.get("merged").is_none() {
        obj["merged"] = json!(pr.get("merged_at").is_some_and(|m| !m.is_null()));
    }
    obj
}

/// A PR of the pulls list: `opened` at its creation, `closed` at its close. The list's simple
/// object has no `merged` field: merged means `merged_at` is set.
pub fn pr_events(ctx: &Ctx, pr: &Value) -> Vec<String> {
    let id = pr.get("id").and_then(Value::as_i64).unwrap_or(0);
    let number = pr.get("number").cloned().unwrap_or(Value::Null);
    let obj = pr_object(pr);
    let mut out = Vec::new();
    if let Some(at) = s(pr, "created_at") {
        out.extend(ctx.event(
            format!("api-pr-{id}-opened"),
            "PullRequestEvent",
            pr.get("user"),
            at,
            json!({"action": "opened", "number": number, "pull_request": obj}),
        ));
    }
    if let Some(at) = s(pr, "closed_at") {
        let actor = pr.get("merged_by").filter(|m| !m.is_null()).or(pr.get("user"));
        out.extend(ctx.event(
            format!("api-pr-{id}-closed"),
            "PullRequestEvent",
            actor,
            at,
            json!({"action": "closed", "number": number, "pull_request": obj}),
        ));
    }
    if let Some(at) = edited_at(pr) {
        out.extend(ctx.event(
            format!("api-pr-{id}-edited"),
            "PullRequestEvent",
            pr.get("user"),
            at,
            json!({"action": "edited", "number": number, "pull_request": obj}),
        ));
    }
    out
}

/// The object's `updated_at` when it is after its creation and close: the object as read is
/// its state then, newer than any comment's copy of it (a comment moves `updated_at`), so an
/// `edited` event at that time makes the tables take this text, not an older copy's.
fn edited_at(o: &Value) -> Option<&str> {
    let updated = s(o, "updated_at")?;
    let last = s(o, "closed_at").max(s(o, "created_at")).unwrap_or("");
    (updated > last).then_some(updated)
}

/// An issue: `opened` at its creation, `closed` at its close.
pub fn issue_events(ctx: &Ctx, issue: &Value) -> Vec<String> {
    let id = issue.get("id").and_then(Value::as_i64).unwrap_or(0);
    let mut out = Vec::new();
    if let Some(at) = s(issue, "created_at") {
        out.extend(ctx.event(
            format!("api-issue-{id}-opened"),
            "IssuesEvent",
            issue.get("user"),
            at,
            json!({"action": "opened", "issue": issue}),
        ));
    }
    if let Some(at) = s(issue, "closed_at") {
        out.extend(ctx.event(
            format!("api-issue-{id}-closed"),
            "IssuesEvent",
            issue.get("closed_by").filter(|c| !c.is_null()).or(issue.get("user")),
            at,
            json!({"action": "closed", "issue": issue}),
        ));
    }
    if let Some(at) = edited_at(issue) {
        out.extend(ctx.event(
            format!("api-issue-{id}-edited"),
            "IssuesEvent",
            issue.get("user"),
            at,
            json!({"action": "edited", "issue": issue}),
        ));
    }
    out
}

/// A comment on issue or PR `number`, with the issue object when the issues list gave it (a
/// comment on an older issue carries a reference: its number, and whether it is a PR).
pub fn comment_events(ctx: &Ctx, c: &Value, number: i64, on_pr: bool, issue: Option<&Value>) -> Vec<String> {
    let id = c.get("id").and_then(Value::as_i64).unwrap_or(0);
    let issue = match issue {
        Some(i) => i.clone(),
        None => {
            let mut i = json!({"number": number, "url": c.get("issue_url")});
            if on_pr {
                i["pull_request"] = json!({"url": Value::Null});
            }
            i
        }
    };
    let Some(at) = s(c, "created_at") else { return Vec::new() };
    ctx.event(
        format!("api-comment-{id}"),
        "IssueCommentEvent",
        c.get("user"),
        at,
        json!({"action": "created", "issue": issue, "comment": c}),
    )
    .into_iter()
    .collect()
}

/// A review comment on PR `number`: `created` with its PR (read this run; else a reference
/// to it, as a comment on an older issue gets).
pub fn review_comment_events(ctx: &Ctx, c: &Value, number: i64, pr: Option<&Value>) -> Vec<String> {
    let id = c.get("id").and_then(Value::as_i64).unwrap_or(0);
    let pr = pr.cloned().unwrap_or_else(|| json!({"number": number, "url": c.get("pull_request_url")}));
    let Some(at) = s(c, "created_at") else { return Vec::new() };
    ctx.event(
        format!("api-review-comment-{id}"),
        "PullRequestReviewCommentEvent",
        c.get("user"),
        at,
        json!({"action": "created", "comment": c, "pull_request": pr}),
    )
    .into_iter()
    .collect()
}

/// A submitted review of `pr`, at its submission (a pending one has none: no event). The
/// REST API spells the state `APPROVED`, the Events API `approved`: the archive's spelling.
pub fn review_events(ctx: &Ctx, review: &Value, pr: &Value) -> Vec<String> {
    let id = review.get("id").and_then(Value::as_i64).unwrap_or(0);
    let Some(at) = s(review, "submitted_at") else { return Vec::new() };
    let mut r = review.clone();
    if let Some(state) = s(review, "state") {
        r["state"] = json!(state.to_ascii_lowercase());
    }
    ctx.event(
        format!("api-review-{id}"),
        "PullRequestReviewEvent",
        review.get("user"),
        at,
        json!({"action": "created", "review": r, "pull_request": pr}),
    )
    .into_iter()
    .collect()
}
