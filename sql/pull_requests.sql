-- pull_requests: one row per pull request with its latest known state.
--
-- Input: `pr_timeline_new` (the timeline partitions this run processes) selects the PRs to
-- recompute; each is recomputed from all of its `pr_timeline` rows, so the result is the same
-- however the history arrived. Each field takes the latest non-NULL value any event carried.
-- Merge state: true on any evidence (merged flag, `merged` action, an issue object's
-- pull_request.merged_at); false only when a full payload said so at or after the last close,
-- or said so of a close (its closed_at) that the last close event followed within a minute: the
-- same close, recorded a moment later (a REST object read by `ingest --github` beside the
-- archive's trimmed stub of its close); otherwise NULL (never a guessed false).
--
-- Git's facts (`pr_git_facts`, from the prs_from_git job) come after the archive with a fixed
-- precedence: a PR the archive never showed gets its row from git (discovery_source = 'git');
-- an archive row takes from git only the fields the archive left NULL (merge state, SHAs,
-- text), and merge_source = 'git' when git decided `merged`. PRs whose facts are newer than
-- this job's last run are recomputed with the timeline's.
WITH touched AS (
    SELECT DISTINCT repo_name, pr_number FROM pr_timeline_new
    UNION
    SELECT repo_name, number FROM pr_git_facts WHERE found_at > (SELECT last_run_at FROM job_last_run)
),
-- The touched PRs are the joins' left (build) side: the timeline and the git facts grow with
-- the lake, and only their rows of the touched PRs pass the dynamic filter the join pushes
-- into their scans (with the timeline on the left, a day's whole timeline sat in the hash
-- table: 1 GB).
t AS (
    SELECT p.*
    FROM touched k
    JOIN pr_timeline p ON p.repo_name = k.repo_name AND p.pr_number = k.pr_number
),
-- Each field is the value of the PR's newest event (by time, then event id) whose FILTER holds:
-- `latest_by` (a swelake aggregate) says what `first_value(x ORDER BY created_at DESC,
-- event_id DESC)` says, in one hash aggregation: DataFusion runs that ordered form behind a
-- window with one partition per PR, 2.5x slower over a day of events.
agg AS (
    SELECT
        repo_name,
        pr_number,
        latest_by(title, created_at, event_id) FILTER (WHERE title IS NOT NULL) AS title,
        latest_by(snapshot_source, created_at, event_id) FILTER (WHERE title IS NOT NULL) AS title_source,
        latest_by(body, created_at, event_id) FILTER (WHERE body IS NOT NULL) AS body,
        latest_by(event_id, created_at, event_id) FILTER (WHERE body IS NOT NULL) AS body_event_id,
        latest_by(event_id, created_at, event_id) FILTER (WHERE title IS NOT NULL) AS title_event_id,
        latest_by(author_login, created_at, event_id) FILTER (WHERE author_login IS NOT NULL) AS author_login,
        latest_by(author_id, created_at, event_id) FILTER (WHERE author_id IS NOT NULL) AS author_id,
        latest_by(author_type, created_at, event_id) FILTER (WHERE author_type IS NOT NULL) AS author_type,
        latest_by(labels, created_at, event_id) FILTER (WHERE labels IS NOT NULL) AS labels,
        latest_by(state, created_at, event_id) FILTER (WHERE state IS NOT NULL) AS state,
        latest_by(kind, created_at, event_id) FILTER (WHERE snapshot_source = 'pull_request_event') AS last_action,
        bool_or(kind = 'merged') AS merged_by_action,
        bool_or(merged) AS merged_by_flag,
        bool_or(snapshot_source = 'issue_event' AND merged_at IS NOT NULL) AS merged_by_issue,
        max(CASE WHEN kind = 'merged' THEN created_at END) AS merged_action_at,
        max(merged_at) AS payload_merged_at,
        latest_by(merged, created_at, event_id) FILTER (WHERE merged IS NOT NULL) AS last_explicit_merged,
        max(CASE WHEN merged IS NOT NULL THEN created_at END) AS last_explicit_at,
        latest_by(closed_at, created_at, event_id) FILTER (WHERE merged IS NOT NULL) AS last_explicit_closed_at,
        max(CASE WHEN kind = 'closed' OR kind = 'merged' THEN created_at END) AS last_close_at,
        latest_by(merge_commit_sha, created_at, event_id) FILTER (WHERE merge_commit_sha IS NOT NULL) AS merge_commit_sha,
        latest_by(base_ref, created_at, event_id) FILTER (WHERE base_ref IS NOT NULL) AS base_ref,
        latest_by(base_sha, created_at, event_id) FILTER (WHERE base_sha IS NOT NULL) AS base_sha,
        latest_by(head_ref, created_at, event_id) FILTER (WHERE head_ref IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_ref,
        latest_by(head_sha, created_at, event_id) FILTER (WHERE head_sha IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_sha,
        latest_by(head_repo_name, created_at, event_id) FILTER (WHERE head_repo_name IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_repo_name,
        latest_by(commits, created_at, event_id) FILTER (WHERE commits IS NOT NULL) AS commits,
        latest_by(additions, created_at, event_id) FILTER (WHERE additions IS NOT NULL) AS additions,
        latest_by(deletions, created_at, event_id) FILTER (WHERE deletions IS NOT NULL) AS deletions,
        latest_by(changed_files, created_at, event_id) FILTER (WHERE changed_files IS NOT NULL) AS changed_files,
        min(item_created_at) AS payload_created_at,
        max(closed_at) AS closed_at,
        min(created_at) AS first_event_at,
        max(created_at) AS last_event_at,
        count(*) AS timeline_events,
        sum(CASE WHEN kind = 'comment' THEN 1 ELSE 0 END) AS comment_events,
        sum(CASE WHEN kind = 'review' THEN 1 ELSE 0 END) AS review_events,
        sum(CASE WHEN kind = 'review_comment' THEN 1 ELSE 0 END) AS review_comment_events,
        sum(CASE WHEN kind = 'push' THEN 1 ELSE 0 END) AS push_events,
        bool_or(payload_trimmed) AS saw_trimmed_payload
    FROM t
    GROUP BY repo_name, pr_number
),
archive AS (
SELECT
    repo_name,
    pr_number AS number,
    title,
    body,
    author_login,
    author_id,
    author_type,
    labels,
    state,
    last_action,
    CASE
        WHEN merged_by_flag OR merged_by_action OR merged_by_issue THEN true
        WHEN last_explicit_merged = false AND (last_close_at IS NULL OR last_explicit_at >= last_close_at
            OR last_close_at <= last_explicit_closed_at + INTERVAL '60 seconds') THEN false
        ELSE CAST(NULL AS BOOLEAN)
    END AS merged,
    CASE WHEN merged_by_flag OR merged_by_action OR merged_by_issue THEN coalesce(payload_merged_at, merged_action_at) END AS merged_at,
    CASE
        WHEN merged_by_flag THEN 'pull_request_event'
        WHEN merged_by_action THEN 'merged_action'
        WHEN merged_by_issue THEN 'issue_event'
        WHEN last_explicit_merged = false AND (last_close_at IS NULL OR last_explicit_at >= last_close_at
            OR last_close_at <= last_explicit_closed_at + INTERVAL '60 seconds') THEN 'pull_request_event'
        ELSE 'unknown'
    END AS merge_source,
    -- Events made from GitHub's REST API (`ingest --github`) have ids `api-…`: the text is
    -- the API's when the body (else the title) came from one.
    CASE
        WHEN coalesce(body_event_id, title_event_id) LIKE 'api-%' THEN 'github_api'
        ELSE coalesce(title_source, 'none')
    END AS metadata_source,
    base_ref,
    base_sha,
    head_ref,
    head_sha,
    head_repo_name,
    merge_commit_sha,
    commits,
    additions,
    deletions,
    changed_files,
    coalesce(payload_created_at, first_event_at) AS created_at,
    closed_at,
    first_event_at,
    last_event_at,
    timeline_events,
    comment_events,
    review_events,
    review_comment_events,
    push_events,
    saw_trimmed_payload
FROM agg
),
g AS (
    SELECT f.*
    FROM touched k
    JOIN pr_git_facts f ON f.repo_name = k.repo_name AND f.number = k.pr_number
)
SELECT
    coalesce(a.repo_name, g.repo_name) AS repo_name,
    coalesce(a.number, g.number) AS number,
    coalesce(a.title, g.title) AS title,
    coalesce(a.body, g.body) AS body,
    coalesce(a.author_login, g.author_login) AS author_login,
    a.author_id,
    a.author_type,
    a.labels,
    coalesce(a.state, CASE WHEN g.merged THEN 'closed' END) AS state,
    a.last_action,
    coalesce(a.merged, g.merged) AS merged,
    CASE WHEN a.merged IS NULL THEN g.merged_at ELSE coalesce(a.merged_at, g.merged_at) END AS merged_at,
    CASE WHEN a.merged IS NULL AND g.merged IS NOT NULL THEN 'git' ELSE coalesce(a.merge_source, 'unknown') END AS merge_source,
    CASE
        WHEN a.title IS NULL AND g.title IS NOT NULL THEN 'git'
        ELSE coalesce(a.metadata_source, 'none')
    END AS metadata_source,
    coalesce(a.base_ref, g.base_ref) AS base_ref,
    coalesce(a.base_sha, g.base_sha) AS base_sha,
    coalesce(a.head_ref, g.head_ref) AS head_ref,
    coalesce(a.head_sha, g.head_sha) AS head_sha,
    a.head_repo_name,
    coalesce(a.merge_commit_sha, g.merge_commit_sha) AS merge_commit_sha,
    a.commits,
    a.additions,
    a.deletions,
    a.changed_files,
    a.created_at,
    coalesce(a.closed_at, g.merged_at) AS closed_at,
    a.first_event_at,
    a.last_event_at,
    coalesce(a.timeline_events, 0) AS timeline_events,
    a.comment_events,
    a.review_events,
    a.review_comment_events,
    a.push_events,
    a.saw_trimmed_payload,
    CASE WHEN a.number IS NULL THEN 'git' ELSE 'gh_archive' END AS discovery_source,
    g.kind AS git_kind
-- The git facts of the touched PRs (few) are the build side.
FROM g
FULL OUTER JOIN archive a ON a.repo_name = g.repo_name AND a.number = g.number
