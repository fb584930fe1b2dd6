-- DuckDB port of sql/pull_requests.sql for `swelake bench jobs` (the baseline): first_value(…
-- ORDER BY …) is DuckDB's first(… ORDER BY …); `pr_timeline_new` is the whole timeline in a
-- first run; pr_git_facts and job_last_run are the empty tables the runner creates.
-- pull_requests: one row per pull request with its latest known state.
--
-- Input: `pr_timeline` (the timeline partitions this run processes) selects the PRs to
-- recompute; each is recomputed from all of its `pr_timeline` rows, so the result is the same
-- however the history arrived. Each field takes the latest non-NULL value any event carried.
-- Merge state: true on any evidence (merged flag, `merged` action, an issue object's
-- pull_request.merged_at); false only when a full payload said so at or after the last close;
-- otherwise NULL (the archive does not say - never a guessed false).
--
-- Git's facts (`pr_git_facts`, from the prs_from_git job) come after the archive with a fixed
-- precedence: a PR the archive never showed gets its row from git (discovery_source = 'git');
-- an archive row takes from git only the fields the archive left NULL (merge state, SHAs,
-- text), and merge_source = 'git' when git decided `merged`. PRs whose facts are newer than
-- this job's last run are recomputed with the timeline's.
WITH touched AS (
    SELECT DISTINCT repo_name, pr_number FROM pr_timeline
    UNION
    SELECT repo_name, number FROM pr_git_facts WHERE found_at > (SELECT last_run_at FROM job_last_run)
),
t AS (
    SELECT p.*
    FROM pr_timeline p
    JOIN touched k ON p.repo_name = k.repo_name AND p.pr_number = k.pr_number
),
agg AS (
    SELECT
        repo_name,
        pr_number,
        first(title ORDER BY created_at DESC, event_id DESC) FILTER (WHERE title IS NOT NULL) AS title,
        first(snapshot_source ORDER BY created_at DESC, event_id DESC) FILTER (WHERE title IS NOT NULL) AS title_source,
        first(body ORDER BY created_at DESC, event_id DESC) FILTER (WHERE body IS NOT NULL) AS body,
        first(author_login ORDER BY created_at DESC, event_id DESC) FILTER (WHERE author_login IS NOT NULL) AS author_login,
        first(author_id ORDER BY created_at DESC, event_id DESC) FILTER (WHERE author_id IS NOT NULL) AS author_id,
        first(author_type ORDER BY created_at DESC, event_id DESC) FILTER (WHERE author_type IS NOT NULL) AS author_type,
        first(labels ORDER BY created_at DESC, event_id DESC) FILTER (WHERE labels IS NOT NULL) AS labels,
        first(state ORDER BY created_at DESC, event_id DESC) FILTER (WHERE state IS NOT NULL) AS state,
        first(kind ORDER BY created_at DESC, event_id DESC) FILTER (WHERE snapshot_source = 'pull_request_event') AS last_action,
        bool_or(kind = 'merged') AS merged_by_action,
        bool_or(merged) AS merged_by_flag,
        bool_or(snapshot_source = 'issue_event' AND merged_at IS NOT NULL) AS merged_by_issue,
        max(CASE WHEN kind = 'merged' THEN created_at END) AS merged_action_at,
        max(merged_at) AS payload_merged_at,
        first(merged ORDER BY created_at DESC, event_id DESC) FILTER (WHERE merged IS NOT NULL) AS last_explicit_merged,
        max(CASE WHEN merged IS NOT NULL THEN created_at END) AS last_explicit_at,
        max(CASE WHEN kind = 'closed' OR kind = 'merged' THEN created_at END) AS last_close_at,
        first(merge_commit_sha ORDER BY created_at DESC, event_id DESC) FILTER (WHERE merge_commit_sha IS NOT NULL) AS merge_commit_sha,
        first(base_ref ORDER BY created_at DESC, event_id DESC) FILTER (WHERE base_ref IS NOT NULL) AS base_ref,
        first(base_sha ORDER BY created_at DESC, event_id DESC) FILTER (WHERE base_sha IS NOT NULL) AS base_sha,
        first(head_ref ORDER BY created_at DESC, event_id DESC) FILTER (WHERE head_ref IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_ref,
        first(head_sha ORDER BY created_at DESC, event_id DESC) FILTER (WHERE head_sha IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_sha,
        first(head_repo_name ORDER BY created_at DESC, event_id DESC) FILTER (WHERE head_repo_name IS NOT NULL AND snapshot_source = 'pull_request_event') AS head_repo_name,
        first(commits ORDER BY created_at DESC, event_id DESC) FILTER (WHERE commits IS NOT NULL) AS commits,
        first(additions ORDER BY created_at DESC, event_id DESC) FILTER (WHERE additions IS NOT NULL) AS additions,
        first(deletions ORDER BY created_at DESC, event_id DESC) FILTER (WHERE deletions IS NOT NULL) AS deletions,
        first(changed_files ORDER BY created_at DESC, event_id DESC) FILTER (WHERE changed_files IS NOT NULL) AS changed_files,
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
        WHEN last_explicit_merged = false AND (last_close_at IS NULL OR last_explicit_at >= last_close_at) THEN false
        ELSE CAST(NULL AS BOOLEAN)
    END AS merged,
    CASE WHEN merged_by_flag OR merged_by_action OR merged_by_issue THEN coalesce(payload_merged_at, merged_action_at) END AS merged_at,
    CASE
        WHEN merged_by_flag THEN 'pull_request_event'
        WHEN merged_by_action THEN 'merged_action'
        WHEN merged_by_issue THEN 'issue_event'
        WHEN last_explicit_merged = false AND (last_close_at IS NULL OR last_explicit_at >= last_close_at) THEN 'pull_request_event'
        ELSE 'unknown'
    END AS merge_source,
    coalesce(title_source, 'none') AS metadata_source,
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
    FROM pr_git_facts f
    JOIN touched k ON f.repo_name = k.repo_name AND f.number = k.pr_number
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
FROM archive a
FULL OUTER JOIN g ON a.repo_name = g.repo_name AND a.number = g.number
