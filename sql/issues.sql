-- issues: one row per issue (pull-request issues included and marked) with its latest state.
--
-- Input: `events_new`. Every IssuesEvent and IssueCommentEvent carries the whole issue object
-- as it was at that moment, so the latest such event is the issue's state; the job's upsert
-- only replaces a stored row with a newer one (`last_event_at`). `metadata_source` says whether
-- that state (its title and body) was read from GH Archive or from GitHub's REST API.
WITH ranked AS (
    SELECT
        *,
        row_number() OVER (PARTITION BY repo_name, number ORDER BY created_at DESC, id DESC) AS rn
    FROM events_new
    WHERE type IN ('IssuesEvent', 'IssueCommentEvent') AND number IS NOT NULL AND repo_name IS NOT NULL
)
SELECT
    repo_name,
    number,
    title,
    body,
    state,
    labels,
    author_login,
    author_id,
    author_type,
    coalesce(is_pull_request, false) AS is_pull_request,
    item_created_at AS created_at,
    closed_at,
    comments,
    CASE WHEN is_pull_request THEN merged_at END AS pr_merged_at,
    created_at AS last_event_at,
    id AS last_event_id,
    -- Events made from GitHub's REST API (`ingest --github`) have ids `api-…`.
    CASE WHEN id LIKE 'api-%' THEN 'github_api' ELSE 'gharchive' END AS metadata_source
FROM ranked
WHERE rn = 1
