//! Record batches of `events` and `events_rejected`, in the layouts of their schema files
//! (`schemas/events.toml`, `schemas/events_rejected.toml`), the only definition of the tables'
//! layout. `events` keeps hand-tuned Arrow builders rather than the schema-driven writer
//! ([`crate::lake::rows`]): it is the hot path of the pipeline (every event of every hour,
//! ~70,000 events/s a core in `swelake bench ingest`), and the builders fill each column in
//! place with no serde pass in between; `tests/it/ingest.rs` checks them against the schema
//! file. Rejected lines, which are few, go through the schema-driven writer.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::SchemaRef;

use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Int64Builder, ListBuilder, RecordBatch, StringBuilder,
    TimestampMicrosecondBuilder,
};

use super::event::{parse_timestamp, Event, Rejection};

pub const EVENTS: &str = "events";
pub const EVENTS_REJECTED: &str = "events_rejected";
/// The events table is partitioned by the UTC date of `created_at`.
pub const EVENT_DATE: &str = "event_date";
/// `source_file` of the events made from GitHub API objects starts so (the rest are hour files).
pub const SOURCE_PREFIX: &str = "github_api/";

/// The schema of `events`, built once from its schema file.
pub static EVENTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| crate::schema::builtin(EVENTS));
/// The schema of `events_rejected`.
pub static REJECTED_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| crate::schema::builtin(EVENTS_REJECTED));

/// Columns whose values are mostly unique long text: no dictionary, no page statistics.
pub const LONG_TEXT_COLUMNS: &[&str] =
    &["id", "body", "title", "comment_body", "push_commit_messages", "push_commit_shas"];

/// Long text that often repeats (see [`crate::lake::writer_properties`]).
pub const REPEATED_TEXT_COLUMNS: &[&str] = &["payload"];

macro_rules! builders {
    ($($name:ident : $ty:ty),* $(,)?) => {
        struct Cols { $($name: $ty,)* }
        impl Cols {
            fn new(cap: usize) -> Self { Cols { $($name: <$ty>::with_capacity(cap),)* } }
            fn finish(&mut self) -> Vec<ArrayRef> { vec![$(Arc::new(self.$name.finish()) as ArrayRef,)*] }
        }
    };
}

// Helper: StringBuilder::with_capacity takes (items, bytes); wrap it to one argument.
struct Str(StringBuilder);
impl Str {
    fn with_capacity(cap: usize) -> Self {
        Str(StringBuilder::with_capacity(cap, cap * 16))
    }
    fn finish(&mut self) -> arrow::array::StringArray {
        self.0.finish()
    }
    fn opt(&mut self, v: Option<&str>) {
        self.0.append_option(v)
    }
    fn val(&mut self, v: &str) {
        self.0.append_value(v)
    }
}

struct StrList(ListBuilder<StringBuilder>);
impl StrList {
    fn with_capacity(cap: usize) -> Self {
        StrList(ListBuilder::with_capacity(StringBuilder::new(), cap))
    }
    fn finish(&mut self) -> arrow::array::ListArray {
        self.0.finish()
    }
    fn opt<'x>(&mut self, v: Option<impl Iterator<Item = Option<&'x str>>>) {
        match v {
            Some(items) => {
                for item in items {
                    self.0.values().append_option(item);
                }
                self.0.append(true);
            }
            None => self.0.append(false),
        }
    }
}

struct Ts(TimestampMicrosecondBuilder);
impl Ts {
    fn with_capacity(cap: usize) -> Self {
        Ts(TimestampMicrosecondBuilder::with_capacity(cap).with_timezone("UTC"))
    }
    fn finish(&mut self) -> arrow::array::TimestampMicrosecondArray {
        self.0.finish()
    }
    fn opt_str(&mut self, v: Option<&str>) {
        self.0.append_option(v.and_then(parse_timestamp))
    }
}

builders! {
    id: Str, kind: Str, actor_id: Int64Builder, actor_login: Str, repo_id: Int64Builder,
    repo_name: Str, org_login: Str, public: BooleanBuilder, created_at: Ts, payload: Str,
    action: Str, number: Int64Builder, is_pull_request: BooleanBuilder, pr_id: Int64Builder,
    title: Str, body: Str, state: Str, draft: BooleanBuilder, author_login: Str,
    author_id: Int64Builder, author_type: Str, author_association: Str, labels: StrList,
    label: Str, item_created_at: Ts, closed_at: Ts, merged: BooleanBuilder, merged_at: Ts,
    merge_commit_sha: Str, base_ref: Str, base_sha: Str, base_repo_name: Str, base_repo_id: Int64Builder,
    head_ref: Str, head_sha: Str, head_repo_name: Str, head_repo_id: Int64Builder, commits: Int64Builder, additions: Int64Builder,
    deletions: Int64Builder, changed_files: Int64Builder, comments: Int64Builder,
    comment_id: Int64Builder, comment_body: Str, comment_author_login: Str,
    comment_author_type: Str, comment_path: Str, review_state: Str, ref_name: Str,
    ref_type: Str, push_head: Str, push_before: Str, push_size: Int64Builder,
    push_commit_shas: StrList, push_commit_messages: StrList, payload_trimmed: BooleanBuilder,
    source_file: Str, source_line: Int64Builder, event_date: Date32Builder, source: Str,
}

/// Accumulates events into Arrow columns; `finish` yields a batch and starts over.
pub struct EventsBuilder {
    cols: Cols,
    rows: usize,
    cap: usize,
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Whether an event is a PR event (`PullRequest…`), and whether it is about a pull request
/// at all (a PR event, or an issue event on a PR's issue).
fn pr_flags(e: &Event<'_>) -> (bool, bool) {
    let is_pr_event = e.kind.starts_with("PullRequest");
    (is_pr_event, is_pr_event || e.payload.issue.as_ref().is_some_and(|i| i.pull_request.is_some()))
}

/// The events of a batch, clustered by what reads them: issue events on issues, events about
/// a pull request, pushes, everything else, in that order.
///
/// Rows keep no order in a Delta table, and this one lets the jobs skip most of a file: the
/// PR jobs read the ~7% of events about a PR and the pushes to their heads, `issues` the issue
/// events. Unclustered, those rows are spread over every page, so every page of every column
/// they read is fetched and decompressed; clustered, a reader's row filter selects a few runs
/// of rows and Parquet's offset index lets it skip the other pages of the wide text columns
/// (`swelake bench jobs`: pr_timeline). `source_line` keeps each event's place in its hour file.
pub struct ClusteredEvents {
    groups: [EventsBuilder; 4],
}

impl ClusteredEvents {
    pub fn new(cap: usize) -> Self {
        // Each group starts at a quarter of the batch: builders grow on demand, and most
        // batches are nearly all pushes or nearly all of the rest.
        ClusteredEvents { groups: std::array::from_fn(|_| EventsBuilder::new((cap / 4).max(1024))) }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.groups.iter().map(EventsBuilder::len).sum()
    }

    pub fn push(&mut self, e: &Event<'_>, source_file: &str, line: u64) {
        let (_, is_pull_request) = pr_flags(e);
        let group = if is_pull_request {
            1
        } else if e.kind == "IssuesEvent" || e.kind == "IssueCommentEvent" {
            0
        } else if e.kind == "PushEvent" {
            2
        } else {
            3
        };
        self.groups[group].push(e, source_file, line);
    }

    /// The held events as batches, one per non-empty group, in group order; starts over.
    pub fn finish(&mut self) -> Vec<RecordBatch> {
        self.finish_groups().into_iter().map(|(_, b)| b).collect()
    }

    /// [`ClusteredEvents::finish`] with each batch's group (0..4).
    pub fn finish_groups(&mut self) -> Vec<(usize, RecordBatch)> {
        self.groups.iter_mut().enumerate().filter(|(_, g)| !g.is_empty()).map(|(i, g)| (i, g.finish())).collect()
    }
}

/// UTC calendar day of a microsecond timestamp, as days since the epoch (Arrow `Date32`).
pub fn date32_of(micros: i64) -> i32 {
    micros.div_euclid(MICROS_PER_DAY) as i32
}

impl EventsBuilder {
    pub fn new(cap: usize) -> Self {
        EventsBuilder { cols: Cols::new(cap), rows: 0, cap }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn push(&mut self, e: &Event<'_>, source_file: &str, line: u64) {
        let c = &mut self.cols;
        let p = &e.payload;
        c.id.val(&e.id);
        c.kind.val(&e.kind);
        c.actor_id.append_option(e.actor_id);
        c.actor_login.opt(e.actor_login.as_deref());
        c.repo_id.append_option(e.repo_id);
        c.repo_name.opt(e.repo_name.as_deref());
        c.org_login.opt(e.org_login.as_deref());
        c.public.append_option(e.public);
        c.created_at.0.append_value(e.created_at);
        c.payload.val(e.payload_raw);
        c.action.opt(p.action.as_deref());

        let (is_pr_event, is_pull_request) = pr_flags(e);
        // The PR or issue this event is about: the PR object for PR events, else the issue.
        let item = if is_pr_event { p.pull_request.as_ref() } else { p.issue.as_ref() };
        c.number.append_option(p.number.or(item.and_then(|i| i.number)));
        c.is_pull_request.append_option(item.is_some().then_some(is_pull_request));
        c.pr_id.append_option(if is_pr_event { item.and_then(|i| i.id) } else { None });
        c.title.opt(item.and_then(|i| i.title.as_deref()));
        c.body.opt(item.and_then(|i| i.body.as_deref()));
        c.state.opt(item.and_then(|i| i.state.as_deref()));
        c.draft.append_option(item.and_then(|i| i.draft));
        let user = item.and_then(|i| i.user.as_ref());
        c.author_login.opt(user.and_then(|u| u.login.as_deref()));
        c.author_id.append_option(user.and_then(|u| u.id));
        c.author_type.opt(user.and_then(|u| u.kind.as_deref()));
        c.author_association.opt(item.and_then(|i| i.author_association.as_deref()));
        c.labels.opt(item.and_then(|i| i.labels.as_ref()).map(|ls| ls.iter().map(|l| l.name.as_deref())));
        c.label.opt(p.label.as_ref().and_then(|l| l.name.as_deref()));
        c.item_created_at.opt_str(item.and_then(|i| i.created_at.as_deref()));
        c.closed_at.opt_str(item.and_then(|i| i.closed_at.as_deref()));
        c.merged.append_option(item.and_then(|i| i.merged));
        // An issue object of a PR carries the merge time under `pull_request.merged_at`.
        let merged_at =
            item.and_then(|i| i.merged_at.as_deref().or(i.pull_request.as_ref().and_then(|l| l.merged_at.as_deref())));
        c.merged_at.opt_str(merged_at);
        c.merge_commit_sha.opt(item.and_then(|i| i.merge_commit_sha.as_deref()));
        let base = item.and_then(|i| i.base.as_ref());
        let head = item.and_then(|i| i.head.as_ref());
        let repo_name = |r: Option<&super::event::GitRef>| {
            r.and_then(|g| g.repo.as_ref())
                .and_then(|r| r.full_name.as_deref().or(r.name.as_deref()).map(str::to_owned))
        };
        c.base_ref.opt(base.and_then(|g| g.ref_name.as_deref()));
        c.base_sha.opt(base.and_then(|g| g.sha.as_deref()));
        c.base_repo_name.opt(repo_name(base).as_deref());
        c.base_repo_id.append_option(base.and_then(|g| g.repo.as_ref()).and_then(|r| r.id));
        c.head_ref.opt(head.and_then(|g| g.ref_name.as_deref()));
        c.head_sha.opt(head.and_then(|g| g.sha.as_deref()));
        c.head_repo_name.opt(repo_name(head).as_deref());
        c.head_repo_id.append_option(head.and_then(|g| g.repo.as_ref()).and_then(|r| r.id));
        c.commits.append_option(item.and_then(|i| i.commits));
        c.additions.append_option(item.and_then(|i| i.additions));
        c.deletions.append_option(item.and_then(|i| i.deletions));
        c.changed_files.append_option(item.and_then(|i| i.changed_files));
        c.comments.append_option(item.and_then(|i| i.comments));

        let comment = p.comment.as_ref().or(p.review.as_ref());
        c.comment_id.append_option(comment.and_then(|x| x.id));
        c.comment_body.opt(comment.and_then(|x| x.body.as_deref()));
        let cu = comment.and_then(|x| x.user.as_ref());
        c.comment_author_login.opt(cu.and_then(|u| u.login.as_deref()));
        c.comment_author_type.opt(cu.and_then(|u| u.kind.as_deref()));
        c.comment_path.opt(p.comment.as_ref().and_then(|x| x.path.as_deref()));
        c.review_state.opt(p.review.as_ref().and_then(|x| x.state.as_deref()));

        c.ref_name.opt(p.ref_name.as_deref());
        c.ref_type.opt(p.ref_type.as_deref());
        c.push_head.opt(p.head.as_deref());
        c.push_before.opt(p.before.as_deref());
        c.push_size.append_option(p.size);
        c.push_commit_shas.opt(p.commits.as_ref().map(|cs| cs.iter().map(|x| x.sha.as_deref())));
        c.push_commit_messages.opt(p.commits.as_ref().map(|cs| cs.iter().map(|x| x.message.as_deref())));
        c.payload_trimmed.append_value(e.payload_trimmed);
        c.source_file.val(source_file);
        c.source_line.append_value(line as i64);
        c.event_date.append_value(date32_of(e.created_at));
        c.source.val(if source_file.starts_with(SOURCE_PREFIX) { "github_api" } else { "gharchive" });
        self.rows += 1;
    }

    pub fn finish(&mut self) -> RecordBatch {
        let mut cols = std::mem::replace(&mut self.cols, Cols::new(self.cap));
        // The payload column holds most of the bytes: start the next batch's buffer at this
        // batch's size, so it is not grown (and copied) from empty again for every batch.
        let payload_bytes = cols.payload.0.values_slice().len();
        let want = (payload_bytes + payload_bytes / 8).clamp(self.cap * 16, 64 << 20);
        self.cols.payload = Str(StringBuilder::with_capacity(self.cap, want));
        let arrays = cols.finish();
        self.rows = 0;
        RecordBatch::try_new(EVENTS_SCHEMA.clone(), arrays).expect("builders follow schemas/events.toml")
    }
}

/// A row of `events_rejected`.
#[derive(serde::Serialize)]
struct RejectedLine {
    source_file: String,
    line_number: u64,
    reason: String,
    detail: String,
    raw: String,
    raw_bytes: usize,
    raw_truncated: bool,
    ingested_at: i64,
}

/// Accumulates rejected lines, written from their schema file by name (they are few: the
/// events' own builders are tuned for millions of rows per hour, these need not be).
#[derive(Default)]
pub struct RejectedBuilder {
    rows: Vec<RejectedLine>,
}

impl RejectedBuilder {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// `raw` is the kept prefix of the line (lossily decoded if it was not UTF-8);
    /// `raw_bytes` the full length of the line as read.
    pub fn push(&mut self, source_file: &str, line: u64, r: &Rejection, raw: &str, raw_bytes: usize, now_micros: i64) {
        self.rows.push(RejectedLine {
            source_file: source_file.to_string(),
            line_number: line,
            reason: r.code.clone(),
            detail: r.detail.clone(),
            raw: raw.to_string(),
            raw_bytes,
            raw_truncated: raw.len() < raw_bytes,
            ingested_at: now_micros,
        });
    }

    pub fn finish(&mut self) -> anyhow::Result<RecordBatch> {
        crate::lake::rows::to_batch(EVENTS_REJECTED, &std::mem::take(&mut self.rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};

    #[test]
    fn clustered_batches_group_events_by_reader_and_keep_every_event() {
        let line = |id: u32, kind: &str, payload: &str| {
            format!(
                r#"{{"id":"{id}","type":"{kind}","actor":{{"id":1,"login":"a"}},"repo":{{"id":2,"name":"o/r"}},"payload":{payload},"public":true,"created_at":"2025-01-01T00:00:00Z"}}"#
            )
        };
        let push = r#"{"ref":"refs/heads/f","head":"h","before":"b","size":1,"commits":[{"sha":"c","message":"m"}]}"#;
        let pr = r#"{"action":"opened","number":3,"pull_request":{"number":3,"title":"t"}}"#;
        let on_pr = r#"{"action":"created","issue":{"number":3,"pull_request":{"url":"u"}},"comment":{"body":"x"}}"#;
        let on_issue = r#"{"action":"created","issue":{"number":4},"comment":{"body":"y"}}"#;
        let star = r#"{"action":"started"}"#;
        // In file order: a push, a star, a PR comment, an issue comment, a PR event, a push.
        let lines = [
            line(1, "PushEvent", push),
            line(2, "WatchEvent", star),
            line(3, "IssueCommentEvent", on_pr),
            line(4, "IssueCommentEvent", on_issue),
            line(5, "PullRequestEvent", pr),
            line(6, "PushEvent", push),
        ];
        let mut b = ClusteredEvents::new(16);
        for (n, l) in lines.iter().enumerate() {
            b.push(&crate::ingest::event::parse_line(l).unwrap(), "f.json.gz", n as u64 + 1);
        }
        assert_eq!(b.len(), 6);
        let batches = b.finish();
        assert_eq!(b.len(), 0, "finish starts over");
        let mut ids = Vec::new();
        let mut lines_of = Vec::new();
        for batch in &batches {
            let id = batch.column_by_name("id").unwrap().as_string::<i32>();
            let line: &Int64Array = batch.column_by_name("source_line").unwrap().as_primitive();
            ids.extend(id.iter().map(|v| v.unwrap().to_string()));
            lines_of.extend(line.iter().map(Option::unwrap));
        }
        // Issue events on issues, then events about a PR (file order kept within a group),
        // then pushes, then the rest; each event keeps its line in the file.
        assert_eq!(ids, ["4", "3", "5", "1", "6", "2"]);
        assert_eq!(lines_of, [4, 3, 5, 1, 6, 2]);
    }
}
